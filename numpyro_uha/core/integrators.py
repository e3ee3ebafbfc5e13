"""Leapfrog (velocity Verlet) integration with a diagonal momentum covariance.

The momentum distribution is S(ρ) = N(0, Σ) with Σ = diag(momentum_scale²), so the
kinetic energy is ½ ρᵀ Σ⁻¹ ρ and the position moves by ε Σ⁻¹ ρ. The integrator state
carries the value and gradient of the *target* log density at the current position, so a
leapfrog step costs one target gradient: the gradient at the end of one step is the
gradient at the start of the next. The bridging density's gradient is rebuilt from that
cached target gradient and a closed-form Gaussian part (see ``annealing.py``).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["IntegratorState", "leapfrog", "kinetic_log_density"]


class IntegratorState(NamedTuple):
    """State of the leapfrog integrator.

    Attributes:
        position: z, shape ``(d,)``.
        momentum: ρ, shape ``(d,)``.
        target_logdensity: log p̄(z), the unnormalized target at ``position``.
        target_grad: ∇ log p̄(z), cached so it is never recomputed.
    """

    position: jax.Array
    momentum: jax.Array
    target_logdensity: jax.Array
    target_grad: jax.Array


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

    Returns:
        The new state. The map (z, ρ) ↦ (z', ρ') has unit Jacobian, and following it by
        a momentum flip makes it its own inverse.
    """
    inverse_mass = 1.0 / momentum_scale**2

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
