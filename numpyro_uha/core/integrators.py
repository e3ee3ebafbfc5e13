"""Leapfrog integration with a diagonal momentum covariance, in its two orders.

The momentum distribution is S(ρ) = N(0, Σ) with Σ = diag(momentum_scale²), so the
kinetic energy is ½ ρᵀ Σ⁻¹ ρ and the position moves by ε Σ⁻¹ ρ. An optional positive
per-coordinate ``drift_scale`` δ multiplies the position update, z += ε δ Σ⁻¹ ρ, which
decouples how far a coordinate drifts from how hard it is kicked (with δ = 1 the map is
the usual leapfrog for the kinetic energy above). Either way every drift and kick is a
shear, so the map has unit Jacobian and is its own inverse after a momentum flip: all
the UHA weight (paper eq. 13) needs, whatever δ is.

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
    return -0.5 * jnp.sum((momentum / momentum_scale) ** 2)


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
        step_size: ε, scalar.
        momentum_scale: sqrt of the diagonal of Σ, shape ``(d,)``.
        target_value_and_grad: z ↦ (log p̄(z), ∇ log p̄(z)).
        bridge_grad: (z, ∇ log p̄(z)) ↦ ∇ log π(z), the gradient of the density being
            simulated, built from the cached target gradient.
        num_steps: L, leapfrog steps (static).
        drift_scale: δ, positive, shape ``(d,)``, multiplying the position update;
            ``None`` means 1.

    Returns:
        The new state. The map (z, ρ) ↦ (z', ρ') has unit Jacobian, and following it by
        a momentum flip makes it its own inverse.
    """
    inverse_mass = _drift_factor(momentum_scale, drift_scale)

    def one_step(_, current: IntegratorState) -> IntegratorState:
        z, rho, _, grad_target = current
        rho = rho + 0.5 * step_size * bridge_grad(z, grad_target)
        z = z + step_size * inverse_mass * rho
        logdensity, grad_target = target_value_and_grad(z)
        rho = rho + 0.5 * step_size * bridge_grad(z, grad_target)
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
        step_size: ε, scalar.
        momentum_scale: sqrt of the diagonal of Σ, shape ``(d,)``.
        target_grad: z ↦ ∇ log p̄(z), evaluated once per step, at the midpoint.
        bridge_grad: (z, ∇ log p̄(z)) ↦ ∇ log π(z).
        num_steps: L (static).
        drift_scale: δ as in :func:`leapfrog`; ``None`` means 1.

    Returns:
        ``(z', ρ')``. Like :func:`leapfrog`, the map has unit Jacobian and is its own
        inverse after a momentum flip.
    """
    half_drift = 0.5 * step_size * _drift_factor(momentum_scale, drift_scale)

    def one_step(_, carry):
        z, rho = carry
        z = z + half_drift * rho
        rho = rho + step_size * bridge_grad(z, target_grad(z))
        return z + half_drift * rho, rho

    if num_steps == 1:
        return one_step(0, (position, momentum))
    return jax.lax.fori_loop(0, num_steps, one_step, (position, momentum))


def _drift_factor(momentum_scale, drift_scale):
    """δ Σ⁻¹, the factor between momentum and position change."""
    inverse_mass = 1.0 / momentum_scale**2
    return inverse_mass if drift_scale is None else drift_scale * inverse_mass
