"""A warm start for q that holds on badly scaled posteriors.

Plain Gaussian VI with Adam (:func:`~numpyro_uha.core.fit_gaussian`) moves every
coordinate of q's mean by about the learning rate per step, whatever that coordinate's
posterior scale: a coefficient known to ±1e-3 is then never resolved, and one with a
posterior sd of 100 takes thousands of steps to reach. :func:`warm_start` first finds the
posterior's scales, then runs the same VI in coordinates where every scale is about one:

1. **A mode by L-BFGS** (``optax.lbfgs``, zoom line search) from ``init_loc``, in
   coordinates standardized by the curvature there, s_i = 1 / sqrt(H_ii),
   H = -∇² log p̄ (``fallback_scale`` where H_ii is not positive and finite).
2. **A Laplace approximation** at that mode: N(mode, diag(s²)) with the curvature
   scales at the mode.
3. **VI from three starts, vectorized** (one compilation): z = m + s ⊙ u (or
   m + diag(s) L_u u for full rank), q_u fitted by :func:`~numpyro_uha.core.fit_gaussian`
   (a) in the model's own coordinates from N(init_loc, fallback_scale²), the plain warm
   start; (b) from init_loc, standardized by the curvature there; (c) from the Laplace
   approximation, standardized by it. The fit with the lowest final loss (mean over its
   last tenth) is kept: the mode of a hierarchical or time-series model can be a
   degenerate spike (a scale → 0) that VI in the spike's coordinates cannot leave, and
   curvature at a random start can mislead, while on a badly scaled regression only a
   standardized start resolves the posterior in a thousand Adam steps.

The result says whether the VI converged (the mean loss over the last tenth of the steps
no lower than over the tenth before, within two standard errors).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from numpyro_uha.core.batching import batched_map
from numpyro_uha.core.vi import fit_gaussian, gaussian_log_weights

__all__ = ["WarmStart", "curvature_scale", "find_mode", "max_curvature", "warm_start"]

#: Above this dimension the Hessian's diagonal (d Hessian-vector products) is skipped.
MAX_CURVATURE_DIM = 2048


class WarmStart(NamedTuple):
    """Result of :func:`warm_start`.

    Attributes:
        loc, scale: the fitted q (scale a vector, or a Cholesky factor for full rank).
        losses: negative ELBO estimates of the VI steps.
        start: which start the kept fit came from: 0 the plain warm start, 1 init_loc
            standardized by its curvature, 2 the Laplace approximation at the mode.
        log_weights: log p̄(z) − log q(z) at ``num_score_draws`` fresh draws z from the
            kept q: their mean estimates its ELBO, the bound UHA starts from and should
            improve on.
        converged: whether the VI's loss had stopped decreasing (see module docstring).
    """

    loc: jax.Array
    scale: jax.Array
    losses: jax.Array
    start: jax.Array
    log_weights: jax.Array
    converged: jax.Array


def curvature_scale(
    logdensity_fn: Callable[[jax.Array], jax.Array], z: jax.Array, fallback: jax.Array
) -> jax.Array:
    """1 / sqrt(-∂² log p̄ / ∂z_i²) at ``z``, ``fallback`` where that is not positive and
    finite (or for every coordinate when d > :data:`MAX_CURVATURE_DIM`)."""
    dim = z.shape[-1]
    fallback = jnp.broadcast_to(jnp.asarray(fallback, z.dtype), (dim,))
    if dim > MAX_CURVATURE_DIM:
        return fallback
    grad = jax.grad(logdensity_fn)

    def hvp_diag(e):
        return jnp.vdot(e, jax.jvp(grad, (z,), (e,))[1])

    # batched_map, not lax.map: no remainder batch beside the scan (see batching.py)
    neg_diag = -batched_map(hvp_diag, jnp.eye(dim, dtype=z.dtype), 256)
    ok = jnp.isfinite(neg_diag) & (neg_diag > 0)
    scale = jnp.where(ok, jax.lax.rsqrt(jnp.where(ok, neg_diag, 1.0)), fallback)
    return jnp.clip(scale, 1e-12, 1e12)


def find_mode(
    logdensity_fn: Callable[[jax.Array], jax.Array],
    init: jax.Array,
    scale: jax.Array,
    num_steps: int = 200,
) -> tuple[jax.Array, jax.Array]:
    """Maximize log p̄ by L-BFGS from ``init``, in coordinates standardized by ``scale``.

    Returns ``(z, log p̄(z))``; the iteration stops early at a non-finite value or
    gradient (the last finite point is returned) or when the gradient vanishes.
    """

    def objective(u):
        return -logdensity_fn(init + scale * u)

    solver = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(objective)
    u0 = jnp.zeros_like(init)

    def cond(carry):
        i, u, state, best_u, best_value, ok = carry
        return (i < num_steps) & ok

    def body(carry):
        i, u, state, best_u, best_value, ok = carry
        value, grad = value_and_grad(u, state=state)
        updates, state = solver.update(grad, state, u, value=value, grad=grad, value_fn=objective)
        new_u = optax.apply_updates(u, updates)
        new_value = objective(new_u)
        finite = jnp.isfinite(new_value) & jnp.all(jnp.isfinite(new_u))
        better = finite & (new_value <= best_value)
        best_u = jnp.where(better, new_u, best_u)
        best_value = jnp.where(better, new_value, best_value)
        small = jnp.max(jnp.abs(grad)) < 1e-6
        return i + 1, new_u, state, best_u, best_value, finite & ~small

    start_value = objective(u0)
    carry = (0, u0, solver.init(u0), u0, start_value, jnp.isfinite(start_value))
    _, _, _, best_u, best_value, _ = jax.lax.while_loop(cond, body, carry)
    return init + scale * best_u, -best_value


def _converged(losses: jax.Array) -> jax.Array:
    n = losses.shape[0] // 10
    if n < 2:
        return jnp.asarray(True)
    last, before = losses[-n:], losses[-2 * n : -n]
    diff = jnp.mean(before) - jnp.mean(last)
    se = jnp.sqrt(jnp.var(before) / n + jnp.var(last) / n)
    return jnp.isfinite(diff) & (diff <= 2.0 * se)


def warm_start(
    rng_key: jax.Array,
    logdensity_fn: Callable[[jax.Array], jax.Array],
    init_loc: jax.Array,
    fallback_scale: float | jax.Array,
    *,
    full_rank: bool = False,
    num_steps: int = 1000,
    learning_rate: float = 0.01,
    num_particles: int = 8,
    mode_steps: int = 200,
    num_score_draws: int = 256,
) -> WarmStart:
    """Fit q to the posterior, robust to its scales (see the module docstring)."""
    init_loc = jnp.asarray(init_loc)
    dtype = init_loc.dtype
    score_key, fit_key = jax.random.split(rng_key)

    scale0 = curvature_scale(logdensity_fn, init_loc, fallback_scale)
    mode, _ = find_mode(logdensity_fn, init_loc, scale0, mode_steps)
    scale1 = curvature_scale(logdensity_fn, mode, scale0)

    dim = init_loc.shape[-1]
    # 0: the plain warm start (z-coordinates, q = N(init_loc, fallback_scale²));
    # 1: from init_loc, standardized by the curvature there;
    # 2: the Laplace approximation at the mode, in its standardized coordinates.
    fallback = jnp.broadcast_to(jnp.asarray(fallback_scale, dtype), (dim,))
    ones = jnp.ones(dim, dtype)
    starts = jnp.stack([init_loc, init_loc, mode])
    scales = jnp.stack([ones, scale0, scale1])
    unit_scales = jnp.stack([fallback, ones, ones])

    def fit_from(loc0, s, unit_scale):
        unit = jnp.diag(unit_scale) if full_rank else unit_scale
        def standardized(u):
            return logdensity_fn(loc0 + s * u)

        fit = fit_gaussian(
            fit_key, standardized, jnp.zeros(dim, dtype), unit,
            num_steps=num_steps, learning_rate=learning_rate, num_particles=num_particles,
        )
        loc = loc0 + s * fit.loc
        scale = s[:, None] * fit.scale if full_rank else s * fit.scale
        # log p̄ in u-coordinates lacks the constant Σ log s: shift the losses to the
        # z-coordinates' negative ELBO.
        return loc, scale, fit.losses - jnp.sum(jnp.log(s))

    locs, fitted_scales, all_losses = jax.vmap(fit_from)(starts, scales, unit_scales)
    tail = max(1, num_steps // 10)
    final = jnp.mean(all_losses[:, -tail:], axis=1)
    final = jnp.where(jnp.isfinite(final), final, jnp.inf)
    best = jnp.argmin(final)
    loc, scale, losses = locs[best], fitted_scales[best], all_losses[best]
    log_weights = gaussian_log_weights(score_key, logdensity_fn, loc, scale, num_score_draws)
    return WarmStart(
        loc, scale, losses, best.astype(jnp.int32), log_weights, _converged(losses)
    )


def max_curvature(
    logdensity_fn: Callable[[jax.Array], jax.Array],
    z: jax.Array,
    scale: jax.Array,
    num_iters: int = 30,
) -> jax.Array:
    """The largest |eigenvalue| of S H S, H = -∇² log p̄ at ``z``, S = diag(``scale``),
    by power iteration on Hessian-vector products (``num_iters`` of them).

    The leapfrog with per-coordinate steps h = ε · scale is stable on the quadratic
    approximation at ``z`` only while ε · sqrt(λ_max(S H S)) < 2.
    """
    grad = jax.grad(logdensity_fn)

    def matvec(v):
        return -scale * jax.jvp(grad, (z,), (scale * v,))[1]

    def body(_, carry):
        v, _ = carry
        w = matvec(v)
        norm = jnp.linalg.norm(w)
        return w / jnp.where(norm > 0, norm, 1.0), norm

    v0 = jnp.ones_like(z) / jnp.sqrt(z.shape[-1])
    _, lam = jax.lax.fori_loop(0, num_iters, body, (v0, jnp.zeros((), z.dtype)))
    return lam
