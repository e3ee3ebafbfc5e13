"""Maps from unconstrained learnable arrays to valid schedules and step sizes.

Gradient-based tuning needs every value to stay valid whatever the optimizer does:
β strictly increasing in (0, 1) with β_0 = 0 and β_{K+1} = 1, and every step size in
(0, ε_max).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = [
    "betas_from_logits",
    "logits_from_betas",
    "step_sizes_from_beta",
    "step_sizes_under_ceiling",
    "interpolate_betas",
]


def betas_from_logits(logits: jax.Array) -> jax.Array:
    """β_1..β_K from K + 1 unconstrained logits (leading axes: one schedule per row).

    The K + 1 gaps β_{m+1} - β_m are ``softmax(logits)``: positive and summing to one, so
    the schedule is strictly increasing from β_0 = 0 to β_{K+1} = 1. Zero logits give the
    linear schedule β_m = m / (K + 1).
    """
    return jnp.cumsum(jax.nn.softmax(logits, axis=-1), axis=-1)[..., :-1]


def logits_from_betas(betas: jax.Array) -> jax.Array:
    """Inverse of :func:`betas_from_logits` (up to the softmax's additive constant);
    leading axes are one schedule per row, as there."""
    betas = jnp.asarray(betas)
    ends = betas.shape[:-1] + (1,)
    edges = jnp.concatenate(
        [jnp.zeros(ends, betas.dtype), betas, jnp.ones(ends, betas.dtype)], axis=-1
    )
    log_gaps = jnp.log(jnp.diff(edges, axis=-1))
    return log_gaps - jnp.mean(log_gaps, axis=-1, keepdims=True)


def step_sizes_from_beta(
    betas: jax.Array, step_size: jax.Array, slope: jax.Array, max_step_size: float
) -> jax.Array:
    """ε(β_m) for every transition.

    ``step_size`` is ε(0) in (0, ε_max); ``slope`` is the change of ε(β) per unit β on the
    logit scale: ε(β) = ε_max · sigmoid(logit(ε(0) / ε_max) + slope · β). This is affine in
    β where the paper's ε(β) is (Section 5.3), bent only to stay inside (0, ε_max); with
    ``slope = 0`` every transition uses ``step_size``.
    """
    base = jnp.log(step_size) - jnp.log(max_step_size - step_size)
    return max_step_size * jax.nn.sigmoid(base + slope * betas)


def step_sizes_under_ceiling(step_sizes: jax.Array, ceiling: jax.Array) -> jax.Array:
    """``min(ε, c)``, the step sizes held under a ceiling c, with a gradient that lets an
    optimizer bring ε back under it.

    The value is the clip's. Its derivative in ε is 0 above c, so a step that starts
    above the ceiling, or is pushed there, would never move again, even where the loss
    wants smaller steps. Here, where ε ≥ c, a cotangent that asks for a smaller step
    (positive: the loss grows with the step) reaches ε as if the clip were not there, so
    gradient descent lowers ε until it is under c and the clip lets go; one that asks for
    a larger step does not (the ceiling holds). The ceiling's own gradient is the clip's.
    ``step_sizes`` and ``ceiling`` broadcast against each other.
    """
    # broadcast first: the elementwise rule below then needs no un-broadcasting of its
    # cotangents (broadcast_arrays' own transpose sums them back to each input's shape)
    return _clip_from_above(*jnp.broadcast_arrays(step_sizes, ceiling))


@jax.custom_vjp
def _clip_from_above(step_sizes, ceiling):
    return jnp.minimum(step_sizes, ceiling)


def _clip_fwd(step_sizes, ceiling):
    return jnp.minimum(step_sizes, ceiling), (step_sizes, ceiling)


def _clip_bwd(residuals, g):
    step_sizes, ceiling = residuals
    above = step_sizes >= ceiling
    d_step = jnp.where(above, jnp.maximum(g, 0.0), g)
    d_ceiling = jnp.where(above, g, jnp.zeros_like(g))
    return d_step.astype(step_sizes.dtype), d_ceiling.astype(ceiling.dtype)


_clip_from_above.defvjp(_clip_fwd, _clip_bwd)


def interpolate_betas(betas: jax.Array, num_transitions: int) -> jax.Array:
    """Appendix D: carry a schedule tuned with K₂ transitions over to K₁ transitions.

    f is the piecewise-linear map with f(k / (K₂ + 1)) = β_k for k = 0..K₂+1; the new
    schedule is β'_k = f(k / (K₁ + 1)). f is strictly increasing from 0 to 1, so the new
    schedule is too.
    """
    betas = jnp.asarray(betas)
    old = betas.shape[0]
    knots_y = jnp.concatenate([jnp.zeros(1, betas.dtype), betas, jnp.ones(1, betas.dtype)])
    knots_x = jnp.arange(old + 2) / (old + 1)
    new_x = jnp.arange(1, num_transitions + 1) / (num_transitions + 1)
    return jnp.interp(new_x, knots_x, knots_y)
