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


#: Where :func:`step_sizes_under_ceiling` leaves the identity, as a fraction of the ceiling.
CEILING_KNEE = 0.9


def step_sizes_under_ceiling(
    step_sizes: jax.Array, ceiling: jax.Array, max_step_size: float
) -> jax.Array:
    """Step sizes in (0, ε_max) held under a ceiling c by a map that keeps their gradient.

    With c' = min(c, ε_max) and the knee k = :data:`CEILING_KNEE` · c': ε itself up to k,
    then linear from (k, k) to (ε_max, c'). The map is continuous and strictly increasing
    from (0, ε_max) onto (0, c'), its slope at least (c' − k) / (ε_max − k), so an
    optimizer can move ε anywhere below the ceiling. A clip (``min(ε, c)``) gives ε no
    gradient while ε is above c: a step that starts there, or is pushed there, never
    moves again. Where c ≥ ε_max the map is the identity (slope 1), and it is
    homogeneous: scaling ε, c and ε_max by one factor scales the result by it.
    """
    top = jnp.minimum(ceiling, max_step_size)
    knee = CEILING_KNEE * top
    slope = (top - knee) / (max_step_size - knee)
    return jnp.where(step_sizes <= knee, step_sizes, knee + slope * (step_sizes - knee))


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
