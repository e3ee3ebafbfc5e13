"""Supports as the model draws them.

A latent site's support can depend on another latent site or on the data:
``x ~ Uniform(0, b)`` with ``b`` latent, a censored point's ``TruncatedNormal(mu, s,
low=c_i)`` with ``c_i`` in a minibatch. The map from unconstrained coordinates to the
site, and its Jacobian, must then be the support at hand, not the one of the trace the
guide was set up with (NumPyro's ``potential_energy`` and ``constrain_fn`` read each
site's support as the model runs, by ``substitute_fn``; so do the guides' chains and
emissions through :func:`trace_at_unconstrained`).
"""

from __future__ import annotations

import jax
from numpyro import handlers
from numpyro.distributions import constraints
from numpyro.distributions.transforms import biject_to


def trace_at_unconstrained(model, unconstrained, args, kwargs, data=None, seed=0):
    """``model``'s trace with each sample site named in ``unconstrained`` at
    ``biject_to(its support)(value)``, the support as the model draws it there; the
    sites named in ``data`` at those (constrained) values. ``seed``: an rng seed for
    sites drawn otherwise. Always seeded: a model that draws keys (NumPyro's ``scan``
    does) would otherwise split the caller's key, inside a JAX transform a leaked
    tracer."""
    data = data or {}

    def constrained(site):
        name = site["name"]
        if site["type"] == "sample" and name in unconstrained:
            return biject_to(site["fn"].support)(unconstrained[name])
        return data.get(name)

    model = handlers.seed(handlers.substitute(model, substitute_fn=constrained), rng_seed=seed)
    with handlers.block():
        return handlers.trace(model).get_trace(*args, **kwargs)


def bounded_by_values(trace, names) -> tuple:
    """The sites among ``names`` whose support in ``trace`` has array parameters
    (bounds): such a support may move with another site's value or with the data, so
    it is read from the model run at hand. Conservative, like NumPyro's
    ``dynamic_support``: array bounds that do not move cost a model replay that ``jit``
    prunes, never a wrong value."""
    return tuple(
        name for name in names
        if any(
            not isinstance(leaf, (bool, int, float))
            for leaf in support_parameters(trace[name]["fn"].support)
        )
    )


def support_parameters(support) -> list:
    """A support's parameters (a constraint is a pytree in NumPyro; its attributes where
    it is not)."""
    leaves = jax.tree.leaves(support)
    if leaves == [support]:  # not registered as a pytree: its attributes
        leaves = jax.tree.leaves(list(vars(support).values()))
    return [leaf for leaf in leaves if not isinstance(leaf, constraints.Constraint)]


#: supports of infinite volume other than the real line (on the real line a flat density
#: is flat in the unconstrained coordinates too, which the setup's probe finds directly)
_UNBOUNDED = tuple(
    getattr(constraints, name) for name in (
        "_GreaterThan", "_LessThan", "_OrderedVector", "_PositiveOrderedVector",
    ) if hasattr(constraints, name)
)


def flat_on_unbounded_support(trace) -> list:
    """The unmasked latent sites of ``trace`` with an improper flat prior
    (:class:`~numpyro.distributions.ImproperUniform`, through ``expand`` and
    ``to_event``) on a support of infinite volume other than the real line (positive,
    bounded on one side, ordered). Where nothing else depends on such a site, the
    posterior is flat in the site's own value over an unbounded set: improper, though in
    the unconstrained coordinates the density is the transform's Jacobian, not flat."""
    from numpyro.distributions import ImproperUniform

    from numpyro_uha._decenter import _unwrap

    names = []
    for name, site in trace.items():
        if site["type"] != "sample" or site["is_observed"] or site.get("mask") is not None:
            continue
        fn = _unwrap(site["fn"])
        support = fn.support
        while isinstance(support, constraints._IndependentConstraint):
            support = support.base_constraint
        if isinstance(fn, ImproperUniform) and isinstance(support, _UNBOUNDED):
            names.append(name)
    return names
