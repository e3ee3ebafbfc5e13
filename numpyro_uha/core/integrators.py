"""Leapfrog integration with a diagonal momentum covariance, in its two orders.

The momentum distribution is S(ρ) = N(0, Σ) with Σ = diag(momentum_scale²), so the
kinetic energy is ½ ρᵀ Σ⁻¹ ρ and the position moves by ε Σ⁻¹ ρ. An optional positive
per-coordinate ``drift_scale`` δ makes the step size per-coordinate: coordinate i drifts
*and* is kicked with the step ε δ_i,

    z ← z + ε δ Σ⁻¹ ρ,        ρ ← ρ + ε δ ∇ log π(z).

This discretizes the flow dz/dt = D Σ⁻¹ ρ, dρ/dt = D ∇ log π(z) with D = diag(δ): its
structure matrix [[0, D], [−D, 0]] is constant and antisymmetric, so it conserves the
same energy H = −log π(z) + ½ ρᵀ Σ⁻¹ ρ as the δ = 1 flow (the one the weight's log S
and the Metropolis test of the corrected sampler use), and its Strang splitting below
is symmetric and second order: the energy error of one step is O(ε³) whatever δ, Σ and
the bridge are. (Scaling the drift alone would conserve the energy of the mass Σ / δ
instead, an O(ε) error per step under the weight's Σ.) Every drift and kick is a shear,
so the map has unit Jacobian and is its own inverse after a momentum flip: all the UHA
weight (paper eq. 13) needs.

* :func:`leapfrog` is **velocity Verlet** (kick, drift, kick). Its state carries the
  value and gradient of the *target* log density at the current position, so a step
  costs one target gradient: the gradient at the end of one step is the gradient at
  the start of the next. A chain of K transitions costs K + 1 gradients.
* :func:`drift_kick_drift` is **position Verlet** (drift, kick, drift): the gradient is
  taken half-way, so K transitions cost K gradients (and the weight one value of the
  target at the end), and the partial momentum refresh between two transitions acts
  between two half drifts rather than two half kicks.

The bridging density's gradient is rebuilt from the target gradient and a closed-form
Gaussian part (see ``annealing.py``).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["IntegratorState", "leapfrog", "drift_kick_drift", "kinetic_log_density"]


class IntegratorState(NamedTuple):
    """State of the leapfrog integrator.

    Attributes:
        position: z, shape ``(d,)``.
        momentum: ρ, shape ``(d,)``.
        target_logdensity: log p̄(z), the unnormalized target at ``position``.
        target_grad: ∇ log p̄(z), cached so it is never recomputed (``None`` where the
            integrator does not use it: position Verlet).
    """

    position: jax.Array
    momentum: jax.Array
    target_logdensity: jax.Array
    target_grad: jax.Array | None


def kinetic_log_density(momentum: jax.Array, momentum_scale: jax.Array) -> jax.Array:
    """log S(ρ) up to the constant that cancels in every ratio S(ρ₁)/S(ρ₂)."""
    return -0.5 * jnp.sum((momentum / momentum_scale) ** 2, axis=-1)


def leapfrog(
    state: IntegratorState,
    step_size: jax.Array,
    momentum_scale: jax.Array,
    target_value_and_grad: Callable[[jax.Array], tuple[jax.Array, jax.Array]],
    bridge_grad: Callable[[jax.Array, jax.Array], jax.Array],
    num_steps: int = 1,
    drift_scale: jax.Array | None = None,
) -> IntegratorState:
    """``num_steps`` velocity Verlet steps for the density whose gradient is ``bridge_grad``.

    Args:
        state: current :class:`IntegratorState`.
        step_size: ε, a scalar (for a batch of chains with their own ε, shape ``(B, 1)``).
        momentum_scale: sqrt of the diagonal of Σ, shape ``(d,)``.
        target_value_and_grad: z ↦ (log p̄(z), ∇ log p̄(z)).
        bridge_grad: (z, ∇ log p̄(z)) ↦ ∇ log π(z), the gradient of the density being
            simulated, built from the cached target gradient.
        num_steps: L, leapfrog steps (static).
        drift_scale: δ, positive, shape ``(d,)``: the per-coordinate factor on the step
            size, multiplying both the position update and the kicks (coordinate i uses
            the step ε δ_i); ``None`` means 1.

    Returns:
        The new state. The map (z, ρ) ↦ (z', ρ') has unit Jacobian, following it by a
        momentum flip makes it its own inverse, and it conserves log π(z) + log S(ρ) to
        O(ε³) per step.
    """
    step = _coordinate_step(step_size, drift_scale)
    drift = step / momentum_scale**2

    def one_step(_, current: IntegratorState) -> IntegratorState:
        z, rho, _, grad_target = current
        rho = rho + 0.5 * step * bridge_grad(z, grad_target)
        z = z + drift * rho
        logdensity, grad_target = target_value_and_grad(z)
        rho = rho + 0.5 * step * bridge_grad(z, grad_target)
        return IntegratorState(z, rho, logdensity, grad_target)

    if num_steps == 1:
        return one_step(0, state)
    return jax.lax.fori_loop(0, num_steps, one_step, state)


def drift_kick_drift(
    position: jax.Array,
    momentum: jax.Array,
    step_size: jax.Array,
    momentum_scale: jax.Array,
    target_grad: Callable[[jax.Array], jax.Array],
    bridge_grad: Callable[[jax.Array, jax.Array], jax.Array],
    num_steps: int = 1,
    drift_scale: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """``num_steps`` position Verlet steps: half drift, kick, half drift.

    Args:
        position: z, shape ``(d,)``.
        momentum: ρ, shape ``(d,)``.
        step_size: ε, a scalar (for a batch of chains with their own ε, shape ``(B, 1)``).
        momentum_scale: sqrt of the diagonal of Σ, shape ``(d,)``.
        target_grad: z ↦ ∇ log p̄(z), evaluated once per step, at the midpoint.
        bridge_grad: (z, ∇ log p̄(z)) ↦ ∇ log π(z).
        num_steps: L (static).
        drift_scale: δ as in :func:`leapfrog`; ``None`` means 1.

    Returns:
        ``(z', ρ')``. Like :func:`leapfrog`, the map has unit Jacobian, is its own
        inverse after a momentum flip and conserves log π + log S to O(ε³) per step.
    """
    step = _coordinate_step(step_size, drift_scale)
    half_drift = 0.5 * step / momentum_scale**2

    def one_step(_, carry):
        z, rho = carry
        z = z + half_drift * rho
        rho = rho + step * bridge_grad(z, target_grad(z))
        return z + half_drift * rho, rho

    if num_steps == 1:
        return one_step(0, (position, momentum))
    return jax.lax.fori_loop(0, num_steps, one_step, (position, momentum))


def _coordinate_step(step_size, drift_scale):
    """ε δ, the per-coordinate step of both the drift and the kick (ε where δ is None)."""
    return step_size if drift_scale is None else step_size * drift_scale
