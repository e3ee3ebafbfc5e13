"""Gaussian densities used as the initial distribution q and the bridge q_ψ(β).

A Gaussian is given by a location ``loc`` (shape ``(d,)``) and a ``scale`` that is
either a vector of standard deviations (shape ``(d,)``, mean-field) or a lower
triangular Cholesky factor L of the covariance (shape ``(d, d)``, full rank).
Everything here is closed form, so the bridge's gradient never costs a call to the
target density.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

__all__ = [
    "gaussian_sample",
    "gaussian_logpdf",
    "gaussian_grad_logpdf",
    "bridge_gaussian",
]

_LOG_2PI = math.log(2.0 * math.pi)


def _is_full_rank(scale: jax.Array) -> bool:
    return jnp.ndim(scale) == 2


def gaussian_sample(noise: jax.Array, loc: jax.Array, scale: jax.Array) -> jax.Array:
    """Reparameterized draw ``loc + scale · noise`` for standard normal ``noise``."""
    if _is_full_rank(scale):
        return loc + scale @ noise
    return loc + scale * noise


def _whiten(z: jax.Array, loc: jax.Array, scale: jax.Array) -> jax.Array:
    if _is_full_rank(scale):
        return solve_triangular(scale, z - loc, lower=True)
    return (z - loc) / scale


def _log_det_scale(scale: jax.Array) -> jax.Array:
    if _is_full_rank(scale):
        return jnp.sum(jnp.log(jnp.abs(jnp.diagonal(scale))))
    return jnp.sum(jnp.log(scale))


def gaussian_logpdf(z: jax.Array, loc: jax.Array, scale: jax.Array) -> jax.Array:
    """log N(z | loc, scale scaleᵀ) (or diag(scale²) for a vector scale)."""
    white = _whiten(z, loc, scale)
    dim = z.shape[-1]
    return -0.5 * jnp.sum(white**2) - _log_det_scale(scale) - 0.5 * dim * _LOG_2PI


def gaussian_grad_logpdf(z: jax.Array, loc: jax.Array, scale: jax.Array) -> jax.Array:
    """∇_z log N(z | loc, ·) = -Σ_q⁻¹ (z - loc), by triangular solves for full rank."""
    if _is_full_rank(scale):
        white = solve_triangular(scale, z - loc, lower=True)
        return -solve_triangular(scale.T, white, lower=False)
    return -(z - loc) / scale**2


def bridge_gaussian(
    beta: jax.Array,
    loc: jax.Array,
    scale: jax.Array,
    loc_slope: jax.Array,
    log_scale_slope: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """The paper's learned bridge q_ψ(β) (Section 5.3).

    The mean is affine in β, ``loc + β · loc_slope``, and the per-coordinate scale is
    multiplied by ``exp(β · log_scale_slope)`` (affine on the log scale, so it stays
    positive). For a full-rank q the rows of the Cholesky factor are scaled, which keeps
    it lower triangular. At β = 0 this is q itself, and with zero slopes it is q for
    every β (the plain bridge q^(1-β) p̄^β).
    """
    new_loc = loc + beta * loc_slope
    factor = jnp.exp(beta * log_scale_slope)
    if _is_full_rank(scale):
        return new_loc, factor[:, None] * scale
    return new_loc, factor * scale
