"""Gaussian densities used as the initial distribution q and the bridge q_ψ(β).

A Gaussian is given by a location ``loc`` (shape ``(d,)``) and a ``scale`` that is
either a vector of standard deviations (shape ``(d,)``, mean-field) or a lower
triangular Cholesky factor L of the covariance (shape ``(d, d)``, full rank; entries
above the diagonal are ignored, by the draws and the densities alike).
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
    "gaussian_logpdf_of_draw",
    "gaussian_grad_logpdf",
    "bridge_gaussian",
    "bridge_gaussian_parts",
]

_LOG_2PI = math.log(2.0 * math.pi)


def _is_full_rank(scale: jax.Array, loc: jax.Array) -> bool:
    """A Cholesky factor has one axis more than ``loc``; a vector of sds (one row or a
    batch of rows, ``(B, d)``) has ``loc``'s shape."""
    return jnp.ndim(scale) == jnp.ndim(loc) + 1


def gaussian_sample(noise: jax.Array, loc: jax.Array, scale: jax.Array) -> jax.Array:
    """Reparameterized draw ``loc + scale · noise`` for standard normal ``noise``.

    A full-rank ``scale`` counts by its lower triangle only, here as in every density
    of this module (an entry above the diagonal, e.g. from unconstrained gradient
    steps on the whole matrix, would otherwise move the draws but not their density).
    """
    if _is_full_rank(scale, loc):
        return loc + jnp.tril(scale) @ noise
    return loc + scale * noise


def _whiten(z: jax.Array, loc: jax.Array, scale: jax.Array) -> jax.Array:
    if _is_full_rank(scale, loc):
        return solve_triangular(scale, z - loc, lower=True)
    return (z - loc) / scale


def _log_det_scale(scale: jax.Array, full_rank: bool) -> jax.Array:
    if full_rank:
        return jnp.sum(jnp.log(jnp.abs(jnp.diagonal(scale))))
    return jnp.sum(jnp.log(scale), axis=-1)


def gaussian_logpdf(z: jax.Array, loc: jax.Array, scale: jax.Array) -> jax.Array:
    """log N(z | loc, scale scaleᵀ) (or diag(scale²) for a vector scale).

    With a vector scale, leading axes of ``z``, ``loc`` and ``scale`` are batch axes (one
    Gaussian per row) and the result has their broadcast batch shape.
    """
    return _logpdf_of_white(_whiten(z, loc, scale), scale, _is_full_rank(scale, loc))


def _logpdf_of_white(white: jax.Array, scale: jax.Array, full_rank: bool) -> jax.Array:
    """log N(z | loc, scale scaleᵀ) from z's whitened coordinates L⁻¹(z − loc)."""
    dim = white.shape[-1]
    return -0.5 * jnp.sum(white**2, axis=-1) - _log_det_scale(scale, full_rank) - 0.5 * dim * _LOG_2PI


def gaussian_logpdf_of_draw(noise: jax.Array, loc: jax.Array, scale: jax.Array) -> jax.Array:
    """log N(z | loc, scale scaleᵀ) at the draw z = ``gaussian_sample(noise, loc, scale)``,
    from ``noise`` itself: −|noise|²/2 − log |det scale| − (d/2) log 2π.

    Equal to ``gaussian_logpdf(gaussian_sample(noise, loc, scale), loc, scale)`` in exact
    arithmetic, value and gradient alike (the whitening of z(θ) gives back the noise
    whatever θ is), but without the triangular solve: in float32 a Cholesky factor of
    condition number 10⁴ or more whitens its own draws with a rounding error that
    |·|² amplifies, and an optimizer of the ELBO then follows that error instead of the
    ELBO (a full-rank VI at d = 501 drove its factor to a condition number of 10²⁰ and its
    "ELBO" to +10²⁸).
    """
    return _logpdf_of_white(noise, scale, _is_full_rank(scale, loc))


def gaussian_grad_logpdf(z: jax.Array, loc: jax.Array, scale: jax.Array) -> jax.Array:
    """∇_z log N(z | loc, ·) = -Σ_q⁻¹ (z - loc), by triangular solves for full rank."""
    if _is_full_rank(scale, loc):
        white = solve_triangular(scale, z - loc, lower=True)
        return -solve_triangular(scale.T, white, lower=False)
    return -(z - loc) / scale**2


def bridge_gaussian_parts(loc, scale, loc_slope, log_scale_slope):
    """The bridge q_ψ(β) of :func:`bridge_gaussian` as ``parts(β) -> (logpdf, grad_logpdf)``,
    two functions of z, with a full-rank factor's triangular inverse computed once for every
    β: L_β = diag(f_β) L (its rows scaled), so L_β⁻¹ = L⁻¹ diag(1/f_β), and whitening is a
    matrix product instead of a triangular solve. The transitions call these at every
    leapfrog step; a solve there ran ~20 times slower per step than the model at d = 90
    on a CPU (XLA's triangular solve on a few right-hand sides is a sequential loop).
    For a vector scale: :func:`gaussian_logpdf` and :func:`gaussian_grad_logpdf` of
    :func:`bridge_gaussian`'s Gaussian, unchanged."""
    if not _is_full_rank(scale, loc):
        def parts(beta):
            bridge_loc, bridge_scale = bridge_gaussian(beta, loc, scale, loc_slope, log_scale_slope)
            return (
                lambda z: gaussian_logpdf(z, bridge_loc, bridge_scale),
                lambda z: gaussian_grad_logpdf(z, bridge_loc, bridge_scale),
            )

        return parts
    tril = jnp.tril(scale)
    dim = tril.shape[-1]
    inverse = solve_triangular(tril, jnp.eye(dim, dtype=tril.dtype), lower=True)
    log_det = jnp.sum(jnp.log(jnp.abs(jnp.diagonal(tril))))

    def parts(beta):
        beta = jnp.expand_dims(beta, -1)
        bridge_loc = loc + beta * loc_slope
        factor = jnp.exp(beta * log_scale_slope)

        def white(z):
            return ((z - bridge_loc) / factor) @ inverse.T

        def logpdf(z):
            log_norm = jnp.sum(beta * log_scale_slope, axis=-1) + log_det + 0.5 * dim * _LOG_2PI
            return -0.5 * jnp.sum(white(z) ** 2, axis=-1) - log_norm

        def grad_logpdf(z):
            return -(white(z) @ inverse) / factor

        return logpdf, grad_logpdf

    return parts


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
    every β (the plain bridge q^(1-β) p̄^β). A ``beta`` with a batch shape (one β per
    row of a batch of mean-field Gaussians) multiplies each row.
    """
    beta = jnp.expand_dims(beta, -1)
    new_loc = loc + beta * loc_slope
    factor = jnp.exp(beta * log_scale_slope)
    if _is_full_rank(scale, loc):
        return new_loc, factor[:, None] * scale
    return new_loc, factor * scale
