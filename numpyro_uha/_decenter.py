"""Automatic non-centering of hierarchical loc-scale sites (``UHAGuide(decenter=...)``).

A latent site ``x ~ Normal(loc, scale)`` whose ``loc`` or ``scale`` is computed from other
latent variables (a group effect under a latent mean and sd; Neal's funnel) makes the
posterior a funnel: the width of ``x`` changes by orders of magnitude with ``scale``. A
Gaussian q in those coordinates fits one width only, and short Hamiltonian chains cannot
walk down the funnel's neck. Written non-centered, ``x = loc + scale · x̃`` with
``x̃ ~ Normal(0, 1)``, the same posterior is much closer to Gaussian when the data say
little about each ``x`` (Papaspiliopoulos, Roberts & Sköld 2007; Gorinova, Moore &
Hoffman 2020 automate the choice, NumPyro's ``LocScaleReparam`` is the handler for it).

The guide runs UHA in the non-centered coordinates (its target is the model under
:func:`numpyro.handlers.reparam` with :class:`Decenter` at each such site, whose density
includes the Jacobian ``scale``) and hands Trace_ELBO, ``Predictive`` and
``sample_posterior`` the sites of the model as written: ``x`` itself, with the guide's
log density corrected by log|dx/dx̃| = Σ log scale. Every choice of coordinates gives a
valid bound; this one only changes which posteriors a Gaussian start and a short chain
can fit.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import handlers
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints
from numpyro.distributions.util import sum_rightmost
from numpyro.infer.initialization import init_to_uniform, init_to_value
from numpyro.infer.reparam import Reparam

from numpyro_uha._compiled_init import _run_quick
from numpyro_uha.core.warm_start import _traced

#: families decentered, with the extra parameters each keeps unchanged: the scalar
#: loc-scale families (``x = loc + scale · x̃``), the multivariate ones with a
#: lower-triangular scale (``x = loc + scale_tril @ x̃``: correlated group effects
#: under an LKJ prior) and the Gaussian random walk (``x = scale · cumsum(x̃)``: a
#: latent path under a latent step size, as in stochastic volatility)
LOC_SCALE_FAMILIES = {
    dist.Normal: (),
    dist.StudentT: ("df",),
    dist.Cauchy: (),
    dist.Laplace: (),
    dist.Logistic: (),
    dist.MultivariateNormal: (),
    dist.MultivariateStudentT: ("df",),
    dist.GaussianRandomWalk: (),
}
#: families non-centered only where named (``decenter=["x"]``), never found by
#: ``decenter="auto"``: a random walk's non-centered steps make its banded posterior dense,
#: which a diagonal q fits worse (on NumPyro's stochastic-volatility model and the
#: Brownian motion of ``numpyro_uha.models`` their warm start began 35 to 78 nats lower in
#: three of four fits, and the one fit that kept them ended lower; docs/how-to/decenter.md)
NOT_AUTOMATIC = (dist.GaussianRandomWalk,)
#: the families whose scale is a lower-triangular matrix
_TRIANGULAR = (dist.MultivariateNormal, dist.MultivariateStudentT)
#: suffix of the standardized site that replaces a decentered site ``x``
SUFFIX = "_decentered"
#: key of the standardized site's ``infer`` dict holding log scale (elementwise)
LOG_SCALE = "uha_decentering_log_scale"
#: key of the standardized site's ``infer`` dict holding (loc, scale, distribution) of
#: the site as the model writes it (for :func:`decentered_init`)
WRITTEN = "uha_decentering_written"


class Decenter(Reparam):
    """``x ~ F(loc, scale)`` becomes ``x̃ ~ F(0, 1)`` (site ``x_decentered``) and the
    deterministic ``x = loc + scale · x̃``: a fully non-centered ``LocScaleReparam``
    that also records log scale (per element) for the guide's Jacobian."""

    def __call__(self, name, fn, obs):
        if obs is not None:
            return fn, obs  # an observed site stays as it is
        shape = fn.shape()
        base, expand_shape, event_dim = self._unwrap(fn)
        standard = self._wrap(_standard(base), expand_shape, event_dim)
        log_scale = jnp.broadcast_to(_log_scale(base), shape)
        noise = numpyro.sample(
            self._unscoped(name) + SUFFIX, standard,
            infer={LOG_SCALE: log_scale, WRITTEN: (base, fn)},
        )
        return None, from_standard(base, noise)

    def _unscoped(self, name):
        """``name`` without the prefixes of the ``numpyro.handlers.scope`` handlers
        inside the ``reparam`` handler that called this: they named the site before the
        reparam saw it, and the standardized site, sampled here, goes through them again
        (``x`` under ``scope(prefix="m")`` becomes ``m/x_decentered``, not
        ``m/m/x_decentered``)."""
        stack = numpyro.primitives._PYRO_STACK
        for position in range(len(stack) - 1, -1, -1):
            handler = stack[position]
            config = getattr(handler, "config", None)
            if isinstance(handler, handlers.reparam) and (
                config is self or (isinstance(config, dict) and self in config.values())
            ):
                break
        else:
            return name
        for handler in stack[position + 1:]:  # outermost first: its prefix comes first
            if isinstance(handler, handlers.scope) and "sample" not in handler.hide_types:
                prefix = f"{handler.prefix}{handler.divider}"
                if name.startswith(prefix):
                    name = name[len(prefix):]
        return name


def _loc(base):
    """loc broadcast to the distribution's batch and event shape."""
    return jnp.broadcast_to(base.loc, base.batch_shape + base.event_shape)


def _walk_scale(base):
    """A random walk's step scale, broadcast against its path (one per step)."""
    return jnp.expand_dims(jnp.asarray(base.scale), -1)


def _standard(base):
    """The family at loc 0 and unit scale, with ``base``'s shapes and kept parameters
    (a random walk's: its independent standard normal steps)."""
    if isinstance(base, dist.GaussianRandomWalk):
        return dist.Normal(jnp.zeros(base.batch_shape + base.event_shape), 1.0).to_event(1)
    kept = {key: getattr(base, key) for key in LOC_SCALE_FAMILIES[type(base)]}
    zeros = jnp.zeros_like(_loc(base))
    if isinstance(base, dist.MultivariateNormal):
        return dist.Normal(zeros, 1.0).to_event(1)
    if isinstance(base, dist.MultivariateStudentT):
        eye = jnp.eye(zeros.shape[-1], dtype=zeros.dtype)
        eye = jnp.broadcast_to(eye, jnp.shape(base.scale_tril))
        return dist.MultivariateStudentT(loc=zeros, scale_tril=eye, **kept)
    return type(base)(loc=zeros, scale=jnp.ones_like(base.scale), **kept)


def from_standard(base, noise):
    """x = loc + scale · x̃ (``scale_tril @ x̃`` for a multivariate family; a random walk's
    path ``scale · cumsum(x̃)`` from its standardized steps)."""
    if isinstance(base, dist.GaussianRandomWalk):
        return _walk_scale(base) * jnp.cumsum(noise, axis=-1)
    if isinstance(base, _TRIANGULAR):
        return _loc(base) + jnp.einsum("...ij,...j->...i", base.scale_tril, noise)
    return base.loc + base.scale * noise


def to_standard(base, value):
    """x̃ = (x − loc) / scale (``scale_tril⁻¹ (x − loc)`` for a multivariate family; a
    random walk's steps over its scale)."""
    if isinstance(base, dist.GaussianRandomWalk):
        value = jnp.asarray(value)
        return jnp.diff(value, axis=-1, prepend=jnp.zeros_like(value[..., :1])) / _walk_scale(base)
    if isinstance(base, _TRIANGULAR):
        centred = value - _loc(base)
        scale_tril = jnp.broadcast_to(base.scale_tril, centred.shape + centred.shape[-1:])
        return jax.scipy.linalg.solve_triangular(scale_tril, centred[..., None], lower=True)[..., 0]
    return (value - base.loc) / base.scale


def _log_scale(base):
    """log |dx/dx̃| per element: log scale, or log of ``scale_tril``'s diagonal (the
    entries of x sum to log |det scale_tril|; a random walk's log scale at every step,
    the cumulative sum's determinant being 1)."""
    if isinstance(base, dist.GaussianRandomWalk):
        return jnp.broadcast_to(jnp.log(_walk_scale(base)), base.batch_shape + base.event_shape)
    if isinstance(base, _TRIANGULAR):
        return jnp.log(jnp.diagonal(base.scale_tril, axis1=-2, axis2=-1))
    return jnp.log(base.scale)


def _moving_parameters(base):
    if isinstance(base, dist.GaussianRandomWalk):
        return ("scale",)
    return ("loc", "scale_tril") if isinstance(base, _TRIANGULAR) else ("loc", "scale")


def _unwrap(fn):
    """The distribution inside ``.expand(...)``/``.to_event(...)`` (NumPyro's own unwrapping)."""
    return Decenter()._unwrap(fn)[0]


#: seeds of the random points :func:`find_decenterable` may trace the model at
PROBE_SEEDS = tuple(range(1, 11))


def _trace_at(model, args, kwargs, seed):
    """The model's trace at ``init_to_uniform``'s point for ``seed``, with NumPyro's
    argument validation off: a random point may give a distribution invalid parameters
    (an ODE's state that went negative under a log, a square root of a negative latent)
    where the user's own initial point and the posterior do not, and the probe only
    compares locs and scales; NumPyro validates eagerly and would raise."""
    with handlers.block(), numpyro.validation_enabled(False):
        traced = handlers.substitute(handlers.seed(model, seed), substitute_fn=_probe_point)
        return handlers.trace(traced).get_trace(*args, **kwargs)


def first_indices(msg):
    """For :func:`numpyro.handlers.substitute`: a subsampled plate's first indices
    instead of a random subsample (other sites: not substituted)."""
    if msg["type"] != "plate":
        return None
    size, subsample_size = msg["args"][:2]
    return jnp.arange(size if subsample_size is None else subsample_size)


def _probe_point(site):
    """``init_to_uniform``'s value at a latent site; at a subsampled plate its first
    indices (:func:`first_indices`), the same at every probe point: random ones made a
    loc read from the data (``Normal(x[idx], 1)``) differ between two points as if it
    depended on a latent."""
    if site["type"] == "plate":
        return first_indices(site)
    return init_to_uniform(site)


def _two_traces(model, args, kwargs):
    """Traces at the first two of :data:`PROBE_SEEDS`' points where the model runs, or
    ``None``: a model that raises at random points (a Python check on a latent's value)
    is probed at others, and one that raises at all of them is left as written (its own
    set-up, at the user's initial point, reports what is wrong with it, if anything)."""
    traces = []
    for seed in PROBE_SEEDS:
        try:
            traces.append(_trace_at(model, args, kwargs, seed))
        except Exception:  # noqa: BLE001 - any failure at a random point: try another
            continue
        if len(traces) == 2:
            return traces
    return None


def find_decenterable(model, args, kwargs, scaled: bool = False) -> list[str]:
    """Latent loc-scale sites whose loc or scale depends on other latent variables
    (random walks excepted: :data:`NOT_AUTOMATIC`), and correlated ones whose fixed
    ``scale_tril`` is :func:`strongly_correlated` (a latent field under a fixed kernel).

    The model is traced at two random points of its unconstrained latent space (NumPyro's
    ``init_to_uniform``, as its autoguides initialize; improper priors included): a site
    qualifies when its distribution is a loc-scale family of real support, unmasked and
    unscaled (``scaled``: scaled ones too, e.g. a subsampled plate's N/B), and its loc or
    scale differs between the two traces, or (a MultivariateNormal or
    MultivariateStudentT) its ``scale_tril`` at the first is strongly correlated
    (:func:`_qualifies`). Validation is off at those points and a point
    where the model raises is replaced by another (:func:`_two_traces`). With concrete
    arguments the two traces are first compiled as one program whose outputs are only
    the candidate sites' parameters (:func:`_compiled_comparison`); a model that cannot
    be traced so (Python control flow on a latent's value, a raise at a probe point) is
    probed point by point, op by op.
    """
    if not _traced((args, kwargs)):
        try:
            return _compiled_comparison(model, args, kwargs, scaled)
        except Exception:  # noqa: BLE001 - not traceable at once (Python control flow on
            pass  # a value, a raise at a random point): the points one by one, as below
    # eagerly where the values are concrete, also under jax.jit (the latents' values
    # come from a fixed seed; only what the traced arguments feed stays traced)
    with jax.ensure_compile_time_eval():
        traces = _two_traces(model, args, kwargs)
    if traces is None:
        return []
    return [
        name for name, pairs, triangular in _compared(*traces, scaled)
        if _qualifies(pairs, triangular)
    ]


def _compared(first, second, scaled):
    """(name, [(its loc/scale in ``first``, in ``second``), ...]) for every latent site
    of ``first`` that :func:`find_decenterable` may choose."""
    for name, site in first.items():
        if site["type"] != "sample" or site["is_observed"] or name not in second:
            continue
        if site.get("infer", {}).get("is_auxiliary") or site.get("mask") is not None:
            continue
        if site.get("scale") is not None and not scaled:
            continue
        base = real_loc_scale(site["fn"])
        if base is None or isinstance(base, NOT_AUTOMATIC):
            continue
        other = _unwrap(second[name]["fn"])
        if type(other) is not type(base):
            continue
        yield (
            name, [(getattr(base, k), getattr(other, k)) for k in _moving_parameters(base)],
            isinstance(base, _TRIANGULAR),
        )


def _compiled_comparison(model, args, kwargs, scaled):
    """:func:`find_decenterable` at the first two probe points in one compiled program
    (its outputs only the candidate sites' locs and scales): run op by op, the two traces
    compiled each of the model's operations on its own (about 20 small programs, 1 to 2 s
    on two CPU cores, most of them for sites no output needs). The arguments' arrays
    enter as the program's inputs (not as constants). Raises where the model cannot be
    traced at once (the caller then probes point by point)."""
    leaves, tree = jax.tree.flatten((args, kwargs))
    arrays = [i for i, leaf in enumerate(leaves) if isinstance(leaf, (jax.Array, np.ndarray))]
    names, kinds = [], []

    def both(values):
        full = list(leaves)
        for i, value in zip(arrays, values):
            full[i] = value
        call_args, call_kwargs = jax.tree.unflatten(tree, full)
        first, second = (
            _trace_at(model, call_args, call_kwargs, seed) for seed in PROBE_SEEDS[:2]
        )
        out = []
        for name, pairs, triangular in _compared(first, second, scaled):
            names.append(name)
            kinds.append(triangular)
            out.append(pairs)
        return out

    # run once: compiled at XLA's lowest CPU optimization (0.36 and 0.74 s to compile at
    # the default level on hierarchical_logistic and stochvol_scan), where that costs
    # less than op by op (else raises: the caller probes op by op)
    compared = _run_quick(both, [leaves[i] for i in arrays])
    return [
        name for name, pairs, triangular in zip(names, compared, kinds)
        if _qualifies(pairs, triangular)
    ]


def real_loc_scale(fn):
    """The loc-scale distribution inside ``fn`` (:data:`LOC_SCALE_FAMILIES`, unwrapped
    from ``.expand``/``.to_event``) if ``fn`` has real support, else ``None``."""
    support = fn.support
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    base = _unwrap(fn)
    if type(base) not in LOC_SCALE_FAMILIES or support is not constraints.real:
        return None
    return base


def written_name(name: str, decentered_sites) -> str:
    """The model's own site for a guide's site: ``x`` for the non-centered
    ``x_decentered`` of a site in ``decentered_sites``, the name itself otherwise."""
    original = name[: -len(SUFFIX)]
    return original if name.endswith(SUFFIX) and original in decentered_sites else name


def _qualifies(pairs, triangular) -> bool:
    """Whether ``decenter="auto"`` non-centers a site: its loc or scale moves with other
    latent variables, or (a correlated family) its fixed scale_tril makes some
    coordinate nearly a function of the others (:func:`strongly_correlated`)."""
    if any(_differ(a, b) for a, b in pairs):
        return True
    return triangular and strongly_correlated(pairs[-1][0])


#: A correlated site with a fixed scale_tril is non-centered by ``decenter="auto"``
#: where some coordinate keeps less than this fraction of its prior variance given the
#: coordinates before it. A latent Gaussian process under a fixed squared-exponential
#: kernel (32 points, length scale 3, jitter 10⁻³; scaled by a latent amplitude) keeps
#: about 10⁻³: in the model's coordinates its warm start began 10 nats below the
#: non-centered one (−32.23 against −22.32) and its draws were 6.6 posterior sds off at
#: Adam 1e-3, right non-centered.
CORRELATED_CONDITIONAL_VARIANCE = 0.1


def strongly_correlated(scale_tril) -> bool:
    """Whether a prior with Cholesky factor ``scale_tril`` (batched or not) has a
    coordinate whose variance given the coordinates before it is below
    :data:`CORRELATED_CONDITIONAL_VARIANCE` of its marginal variance: L_ii² / Σ_j L_ij²,
    in O(n²) (no eigendecomposition, for large latent fields). ``False`` where the
    factor is traced or not finite."""
    if isinstance(scale_tril, jax.core.Tracer):
        return False
    tril = np.asarray(scale_tril, np.float64)
    if tril.ndim < 2 or tril.shape[-1] < 2 or not np.all(np.isfinite(tril)):
        return False
    with np.errstate(divide="ignore", invalid="ignore"):
        return bool(_least_kept(tril, np) < CORRELATED_CONDITIONAL_VARIANCE)


def _least_kept(tril, xp):
    """The smallest fraction of a coordinate's prior variance kept given the
    coordinates before it, L_ii² / Σ_j L_ij², over every row (and batch) of ``tril``
    (``xp``: NumPy or jax.numpy; 1 where a row is zero)."""
    diag = xp.diagonal(tril, axis1=-2, axis2=-1) ** 2
    rows = xp.sum(tril**2, axis=-1)
    return xp.min(xp.where(rows > 0, diag / xp.where(rows > 0, rows, 1.0), 1.0))


def _differ(a, b) -> bool:
    """Whether two traced values of a loc or scale differ; one computed from an argument
    that is itself traced (a model set up inside ``jax.jit``, the data an argument of the
    jitted function) cannot be compared and counts as differing: non-centering such a
    site is valid, only perhaps not needed."""
    if isinstance(a, jax.core.Tracer) or isinstance(b, jax.core.Tracer):
        return True
    return np.shape(a) != np.shape(b) or not np.array_equal(np.asarray(a), np.asarray(b))


def decentered_init(init_loc_fn):
    """``init_loc_fn`` for the non-centered model, at the point it gives the model as
    written: ``x̃ = (x₀ − loc) / scale`` with ``x₀`` what ``init_loc_fn`` gives the site
    ``x`` itself (``init_to_value`` keyed by ``x`` included). A ``functools.partial`` of
    a module function, as NumPyro's ``init_to_*`` strategies are, so a guide holding it
    pickles.

    Drawn directly in the standardized coordinates (``init_to_uniform``'s ±2), x̃ would be
    scaled by a scale that is itself drawn on the log scale: on a Poisson model with 300
    random intercepts (log link), x = scale · x̃ reached ±15 and the warm start never
    recovered (start ELBO −1.2e5 against −517 in the model's coordinates).

    Except at a correlated site whose prior keeps less than
    :data:`CORRELATED_CONDITIONAL_VARIANCE` of some coordinate's variance given the
    others (a smooth latent field), unless ``init_to_value`` names the site: there
    ``init_to_uniform``'s independent ±2 per coordinate lie far out in the prior's tails
    (x̃ = L⁻¹ x₀ reached ≈ 60 on a latent Gaussian process of 32 points, and its warm
    start began 4.6 nats lower, −26.87 against −22.32), and x̃ is drawn itself.
    """
    return partial(_init_as_written, init_loc_fn=init_loc_fn)


def _init_as_written(site=None, init_loc_fn=None):
    if site is None:  # NumPyro calls a strategy without a site to get it
        return partial(_init_as_written, init_loc_fn=init_loc_fn)
    written = site.get("infer", {}).get(WRITTEN) if site.get("type") == "sample" else None
    if written is None:
        return init_loc_fn(site)
    base, fn = written
    value = init_loc_fn(dict(site, name=site["name"][: -len(SUFFIX)], fn=fn))
    if value is None:
        return init_loc_fn(site)
    standard = to_standard(base, value)
    if not isinstance(base, _TRIANGULAR) or _given(init_loc_fn, site["name"][: -len(SUFFIX)]):
        return standard
    # a strongly correlated prior (a smooth latent field): x₀'s independent coordinates
    # are far out in its tails, so x̃ is drawn itself (a choice made in the traced
    # program too: NumPyro's initialization runs compiled)
    drawn = init_loc_fn(site)
    if drawn is None:
        return standard
    correlated = _least_kept(base.scale_tril, jnp) < CORRELATED_CONDITIONAL_VARIANCE
    return jnp.where(correlated, jnp.asarray(drawn, jnp.result_type(standard)), standard)


def _given(init_loc_fn, name) -> bool:
    """Whether ``init_loc_fn`` is ``init_to_value`` with a value for site ``name`` (a
    start the user chose, kept as given)."""
    return (
        isinstance(init_loc_fn, partial) and init_loc_fn.func is init_to_value
        and name in (init_loc_fn.keywords.get("values") or {})
    )


def decentered_model(model, names):
    """``model`` with each site in ``names`` non-centered by :class:`Decenter`."""
    return handlers.reparam(model, config={name: Decenter() for name in names})


def decentered_values(model, args, kwargs, values, names):
    """Map the model's own site values (one draw) to the non-centered coordinates:
    ``x̃ = (x − loc) / scale`` for each ``x`` in ``names``, loc and scale read from the
    model traced at ``values``; other entries are kept."""
    with handlers.block():
        traced = handlers.substitute(handlers.seed(model, 0), data=values)
        model_trace = handlers.trace(traced).get_trace(*args, **kwargs)
    out = {k: v for k, v in values.items() if k not in names}
    for name in names:
        out[name + SUFFIX] = to_standard(_unwrap(model_trace[name]["fn"]), values[name])
    return out


def emitted_log_density(site, mask_off: bool):
    """−log|dx/dx̃| of a decentered site, summed over its event dims (the guide's Delta
    log density for ``x``)."""
    if mask_off:
        return 0.0
    log_scale = site["infer"][LOG_SCALE]
    event_dim = site["fn"].event_dim
    return sum_rightmost(-log_scale, event_dim)


__all__ = [
    "Decenter",
    "LOC_SCALE_FAMILIES",
    "decentered_init",
    "decentered_model",
    "decentered_values",
    "emitted_log_density",
    "find_decenterable",
    "from_standard",
    "real_loc_scale",
    "to_standard",
    "written_name",
]
