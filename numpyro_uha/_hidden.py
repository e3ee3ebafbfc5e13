"""Latent sites a guide part cannot see (``numpyro.handlers.block``) but depends on.

In an :class:`~numpyro.infer.autoguide.AutoGuideList`, each part is built on the model with
the other parts' sites hidden (``block(model, hide=[...])``, as NumPyro's documentation
shows). A Gaussian part never evaluates that model's density; a UHA part's chains do. In
the blocked model a hidden latent site takes a draw from its prior (under the guide's fixed
seed), not the value the other part draws in the same ELBO term, so where this part's
sites or their observations depend on it, the chains anneal to the posterior given one
arbitrary prior draw: a valid but useless bound (on x ~ N(mu, 1) with mu hidden and
drawn at −24.4, the part's draws were centred at 24 for an exact 1.0, and its only signal
was a k̂ warning blaming the learning rate). Parts that are independent a posteriori
are exact (the hidden sites' terms are constants that cancel in the weights).

:func:`hidden_parents` finds such sites by a double difference of the inner model's log
density: with visible values v₁, v₂ and hidden values h₁, h₂ (four seeded prior draws),
``f(v₁, h₁) − f(v₂, h₁) − f(v₁, h₂) + f(v₂, h₂)`` is zero when the visible part's density
does not depend on the hidden sites (the terms of the hidden sites alone cancel). A
visible site whose support a hidden one sets (``x ~ Uniform(0, top)``: its density's
``−log top`` cancels there too) is found by comparing its support's bounds under h₁ and h₂.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro import handlers
from numpyro.infer.util import log_density

#: seeds of the prior draws compared
_SEEDS = (0, 1, 2, 3)


def _hiding_blocks(model):
    """The ``block`` handlers ``model`` is wrapped in (outermost first) and the callable
    inside them."""
    blocks = []
    while isinstance(model, handlers.block):
        blocks.append(model)
        model = model.fn
    return blocks, model


def hidden_parents(model, args, kwargs) -> list[str]:
    """Latent sample sites that the ``block`` handlers wrapping ``model`` hide and on
    which the density of the sites left visible depends ([] where ``model`` is not a
    ``block``, where none is hidden, or where it cannot be told: values traced under
    ``jax.jit``, or a model that fails at prior draws)."""
    blocks, inner = _hiding_blocks(model)
    if not blocks:
        return []
    try:
        with jax.ensure_compile_time_eval(), handlers.block():
            traces = [
                handlers.trace(handlers.seed(inner, seed)).get_trace(*args, **kwargs)
                for seed in _SEEDS
            ]
    except Exception:  # noqa: BLE001 - a model that fails at prior draws: its setup says why
        return []
    first = traces[0]

    def hidden(site):
        return any(block.hide_fn(site) for block in blocks)

    latent = [
        name for name, site in first.items()
        if site["type"] == "sample" and not site["is_observed"]
        and not site.get("infer", {}).get("enumerate")
        and not site["fn"].support.is_discrete
    ]
    hidden_names = [name for name in latent if hidden(first[name])]
    visible = [name for name in latent if name not in hidden_names]
    if not hidden_names or not visible:
        return []

    def values(trace, names):
        return {name: trace[name]["value"] for name in names if name in trace}

    v1, v2 = values(traces[0], visible), values(traces[1], visible)
    h1, h2 = values(traces[2], hidden_names), values(traces[3], hidden_names)
    try:
        with jax.ensure_compile_time_eval(), handlers.block(), numpyro.validation_enabled(False):
            evaluated = [
                log_density(handlers.seed(inner, 0), args, kwargs, {**v, **h})
                for v, h in ((v1, h1), (v2, h1), (v1, h2), (v2, h2))
            ]
    except Exception:  # noqa: BLE001 - cannot be evaluated at these points: cannot tell
        return []
    f = [value for value, _ in evaluated]
    if any(isinstance(value, jax.core.Tracer) for value in f):
        return []
    # a visible site's support set by a hidden site (x ~ Uniform(0, top)): its density
    # may not change with it where x is inside both, but the chains' coordinates do
    first_h, second_h = evaluated[0][1], evaluated[2][1]
    if any(
        _differ(first_h[name]["fn"].support, second_h[name]["fn"].support)
        for name in visible if name in first_h and name in second_h
    ):
        return hidden_names
    f = np.asarray(jnp.stack(f), dtype=np.float64)
    finite = np.isfinite(f)
    if not finite.all():
        # the same visible values in and out of support as the hidden ones move: they
        # bound it; otherwise the model is not finite at these draws and cannot tell
        moved = finite[0] != finite[2] or finite[1] != finite[3]
        return hidden_names if moved else []
    double_difference = f[0] - f[1] - f[2] + f[3]
    if abs(double_difference) <= 1e-4 * (1.0 + np.max(np.abs(f))):
        return []
    return hidden_names


def _differ(first, second, depth=0) -> bool:
    """Whether two constraints (a support's bounds, possibly wrapped in ``independent``)
    differ in type or in any array or number they hold."""
    if type(first) is not type(second):
        return True
    if depth > 4:
        return False
    for key, a in vars(first).items():
        b = vars(second).get(key)
        if hasattr(a, "__dict__") and not isinstance(a, (jax.Array, np.ndarray)):
            if _differ(a, b, depth + 1):
                return True
        elif isinstance(a, (jax.Array, np.ndarray, float, int)):
            if isinstance(b, jax.core.Tracer) or isinstance(a, jax.core.Tracer):
                continue
            if np.shape(a) != np.shape(b) or not np.array_equal(np.asarray(a), np.asarray(b)):
                return True
    return False
