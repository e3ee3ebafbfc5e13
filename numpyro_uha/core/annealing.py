"""Uncorrected Hamiltonian Annealing (UHA) and its Metropolis-corrected twin (HAIS).

One draw runs K annealing transitions (paper Algorithms 3-4, with Algorithm 5's
estimator). Transition m targets the bridging density

    π_m(z) = q_ψ(β_m)(z)^(1-β_m) · p̄(z)^(β_m),        0 < β_1 < ... < β_K < 1,

and consists of a partial momentum refresh ρ' = η ρ + sqrt(1-η²) ξ, ξ ~ N(0, Σ),
followed by L leapfrog steps of size ε_m (velocity Verlet, kick-drift-kick, or position
Verlet, drift-kick-drift: ``integrator``; see ``integrators.py``). The momentum flip of
Algorithm 3 step 3 undoes the flip that makes the leapfrog self-inverse, so neither is
carried out.

With K transitions there are K bridging densities, the paper's "K" (bridging densities
plus one) is K + 1, and L = 1 costs K + 1 target gradients with velocity Verlet, or K
gradients and K + 1 values with position Verlet.

The UHA log weight (paper eq. 13) is

    log w = log p̄(z_{K+1}) - log q(z_1) + Σ_m [log S(ρ_{m+1}) - log S(ρ'_m)],

an unbiased estimate of Z after exponentiation for *any* parameter values, and a
reparameterized, differentiable lower bound on log Z in expectation.

With ``corrected=True`` each transition ends with the Metropolis accept/reject step of
Algorithm 1 and the weight is the Hamiltonian AIS weight (Algorithm 6),

    log w = log p̄(z_{K+1}) - log q(z_1) + Σ_m [log π_m(z_m) - log π_m(z_{m+1})],

which is also unbiased but not differentiable.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from numpyro_uha.core.gaussian import (
    bridge_gaussian,
    gaussian_grad_logpdf,
    gaussian_logpdf,
    gaussian_sample,
)
from numpyro_uha.core.integrators import (
    IntegratorState,
    drift_kick_drift,
    kinetic_log_density,
    leapfrog,
)

__all__ = [
    "AnnealingParams",
    "AnnealingInfo",
    "make_params",
    "annealed_sample",
    "uha_sample",
    "hais_sample",
    "reverse_annealed_sample",
]

LogDensityFn = Callable[[jax.Array], jax.Array]

#: The leapfrog orders ``annealed_sample`` can use.
INTEGRATORS = ("velocity_verlet", "position_verlet")


class AnnealingParams(NamedTuple):
    """Every quantity that defines the annealed proposal, as constrained values.

    Taking q's parameters as plain inputs lets an encoder produce them (amortized use,
    one chain per data point under ``vmap``).

    Attributes:
        loc: μ, mean of the initial Gaussian q, shape ``(d,)``.
        scale: q's standard deviations (shape ``(d,)``) or lower-triangular Cholesky
            factor of its covariance (shape ``(d, d)``).
        betas: β_1..β_K, the bridging coefficients, strictly increasing in (0, 1),
            shape ``(K,)``; β_0 = 0 and β_{K+1} = 1 are implicit.
        step_sizes: ε_m used in transition m, positive, shape ``(K,)``.
        damping: η in [0, 1), momentum persistence of the partial refresh.
        momentum_scale: sqrt(diag Σ), the momentum distribution's scales, shape ``(d,)``.
        bridge_loc_slope: ψ's mean slope; q_ψ(β) has mean ``loc + β · bridge_loc_slope``.
        bridge_log_scale_slope: ψ's scale slope; q_ψ(β) has scale
            ``exp(β · bridge_log_scale_slope) · scale``.
        drift_scale: δ, positive, shape ``(d,)``: a per-coordinate factor on the step
            size, so coordinate i drifts and is kicked with the step ε_m δ_i
            (z += ε δ Σ⁻¹ ρ, ρ += ε δ ∇ log π_m); the leapfrog then still conserves the
            energy −log π_m + ½ ρᵀ Σ⁻¹ ρ that the weight and the Metropolis test use, to
            second order (see ``integrators.py``). ``None`` (the default) means 1.
        force_limit: L, positive, shape ``(d,)``, or ``None`` (the default: no limit).
            The kick uses the force L ⊙ tanh(∇ log π_m / L) instead of ∇ log π_m: equal
            to it where |∇ log π_m| ≪ L, bounded by L everywhere. A kick by *any* force
            that depends on the position only is a shear, so the leapfrog keeps its unit
            Jacobian and reversibility, and the UHA weight (which uses no bridging
            density) stays exact: the bound and E[w] = Z hold for every L. What L buys:
            a draw in q's far tails, where the gradient is huge (an exp link, a
            hierarchical scale near 0), can no longer be thrown to infinity in a few
            steps; its momentum grows at most linearly and its weight is finite (and
            small), so training sees it instead of a NaN.
    """

    loc: jax.Array
    scale: jax.Array
    betas: jax.Array
    step_sizes: jax.Array
    damping: jax.Array
    momentum_scale: jax.Array
    bridge_loc_slope: jax.Array
    bridge_log_scale_slope: jax.Array
    drift_scale: jax.Array | None = None
    force_limit: jax.Array | None = None


class AnnealingInfo(NamedTuple):
    """Per-draw diagnostics. Arrays with a leading ``K`` are per transition.

    Attributes:
        initial_position: z_1 ~ q.
        log_q_initial: log q(z_1).
        target_logdensity: log p̄(z_{m+1}) after transition m, shape ``(K,)``.
        momentum_log_ratio: log S(ρ_{m+1}) - log S(ρ'_m), the UHA increments, ``(K,)``.
        log_accept_ratio: log π_m(z'', ρ'') - log π_m(z_m, ρ'_m), the energy error of the
            leapfrog proposal; exp(min(0, ·)) is the acceptance probability the
            Metropolis-corrected transition would have, ``(K,)``.
        accepted: whether the proposal was taken (always True when uncorrected), ``(K,)``.
        log_weight_increments: the terms summed into the log weight, ``(K,)``.
    """

    initial_position: jax.Array
    log_q_initial: jax.Array
    target_logdensity: jax.Array
    momentum_log_ratio: jax.Array
    log_accept_ratio: jax.Array
    accepted: jax.Array
    log_weight_increments: jax.Array


def make_params(
    loc: jax.Array,
    scale: jax.Array,
    *,
    num_transitions: int | None = None,
    betas: jax.Array | None = None,
    step_size: float | jax.Array = 0.1,
    damping: float | jax.Array = 0.9,
    momentum_scale: jax.Array | None = None,
    bridge_loc_slope: jax.Array | None = None,
    bridge_log_scale_slope: jax.Array | None = None,
    drift_scale: jax.Array | None = None,
    force_limit: jax.Array | None = None,
) -> AnnealingParams:
    """Build :class:`AnnealingParams` with the plain defaults filled in.

    Defaults: linear schedule β_m = m / (K + 1), identity momentum covariance, no
    bridge slopes (q_ψ(β) = q) and no drift scale (δ = 1). A scalar ``step_size`` is used
    for every transition.
    """
    loc = jnp.asarray(loc)
    dim = loc.shape[-1]
    if betas is None:
        if num_transitions is None:
            raise ValueError("make_params needs either `betas` or `num_transitions`.")
        betas = jnp.arange(1, num_transitions + 1) / (num_transitions + 1)
    betas = jnp.asarray(betas, dtype=loc.dtype)
    zeros = jnp.zeros(dim, loc.dtype)
    return AnnealingParams(
        loc=loc,
        scale=jnp.asarray(scale, loc.dtype),
        betas=betas,
        step_sizes=jnp.broadcast_to(jnp.asarray(step_size, loc.dtype), betas.shape),
        damping=jnp.asarray(damping, loc.dtype),
        momentum_scale=jnp.ones(dim, loc.dtype) if momentum_scale is None else momentum_scale,
        bridge_loc_slope=zeros if bridge_loc_slope is None else bridge_loc_slope,
        bridge_log_scale_slope=zeros if bridge_log_scale_slope is None else bridge_log_scale_slope,
        drift_scale=drift_scale,
        force_limit=force_limit,
    )


def annealed_sample(
    rng_key: jax.Array,
    logdensity_fn: LogDensityFn,
    params: AnnealingParams,
    *,
    num_leapfrog_steps: int = 1,
    corrected: bool = False,
    remat: bool = False,
    integrator: str = "velocity_verlet",
) -> tuple[jax.Array, jax.Array, AnnealingInfo]:
    """One annealed draw: ``(z_{K+1}, log w, info)``.

    Args:
        rng_key: JAX PRNG key.
        logdensity_fn: z ↦ log p̄(z) for a flat ``z`` of shape ``(d,)``.
        params: :class:`AnnealingParams`.
        num_leapfrog_steps: L, leapfrog steps per transition (static). L = 1 is
            under-damped Langevin dynamics, the paper's setting.
        corrected: add the Metropolis accept/reject step (Hamiltonian AIS) and use its
            weight. The result is then not differentiable in the parameters.
        remat: rematerialize each transition in the backward pass (``jax.checkpoint``),
            so reverse-mode memory no longer grows with the model's intermediates times
            K; costs about one extra forward pass.
        integrator: ``"velocity_verlet"`` (kick-drift-kick) or ``"position_verlet"``
            (drift-kick-drift), see ``integrators.py``. Both give a valid weight.

    Returns:
        The final position, the log importance weight and :class:`AnnealingInfo`.
        The function is pure and safe under ``jit``, ``vmap`` and ``grad``.
    """
    loc, scale = params.loc, params.scale
    key_init, key_momentum, key_refresh, key_accept = jax.random.split(rng_key, 4)

    z_init = gaussian_sample(jax.random.normal(key_init, loc.shape[-1:], loc.dtype), loc, scale)
    log_q_initial = gaussian_logpdf(z_init, loc, scale)
    momentum, move, refresh, steps = _chain_parts(
        logdensity_fn, params, key_momentum, key_refresh, key_accept,
        num_leapfrog_steps, corrected, integrator,
    )
    state = _initial_state(logdensity_fn, z_init, momentum, integrator)

    def transition(state, step):
        beta, step_size, noise, uniform = step
        return move(refresh(state, noise), beta, step_size, uniform)

    if remat:
        transition = jax.checkpoint(transition, prevent_cse=False)
    final_state, per_step = jax.lax.scan(transition, state, steps)
    final_logdensity = final_state.target_logdensity
    if integrator == "position_verlet" and not corrected:
        # Evaluated afresh so that nothing outside the scan reads the carried value: when
        # the per-transition diagnostics are not used either (training), XLA then drops
        # the K per-step evaluations of log p̄ that only they need. With them the SVI step
        # on madelon (d = 501, K = 32) costs 145 MFLOP, without them 112 (compiled
        # cost analysis), and every transition costs one target gradient and no more.
        final_logdensity = logdensity_fn(final_state.position)
    log_weight = final_logdensity - log_q_initial + jnp.sum(per_step[-1])
    info = AnnealingInfo(z_init, log_q_initial, *per_step)
    return final_state.position, log_weight, info


def check_integrator(integrator):
    """Raise a ``ValueError`` naming the choices unless ``integrator`` is one of :data:`INTEGRATORS`."""
    if integrator not in INTEGRATORS:
        raise ValueError(f"integrator must be one of {INTEGRATORS}, got {integrator!r}.")


def _initial_state(logdensity_fn, position, momentum, integrator):
    """The integrator state at ``position``: position Verlet needs no gradient there."""
    check_integrator(integrator)
    if integrator == "position_verlet":
        return IntegratorState(position, momentum, logdensity_fn(position), None)
    return IntegratorState(position, momentum, *jax.value_and_grad(logdensity_fn)(position))


def _chain_parts(
    logdensity_fn, params, key_momentum, key_refresh, key_accept, num_leapfrog_steps, corrected,
    integrator,
):
    """What the forward and the reverse sampler share: ``(momentum, move, refresh, steps)``.

    ``momentum`` is the first momentum, ρ ~ N(0, Σ); ``move`` the leapfrog part of a
    transition (:func:`_make_move`); ``refresh(state, noise)`` the partial momentum refresh
    ρ ← η ρ + sqrt(1 − η²) Σ^(1/2) ξ; ``steps`` the scanned inputs (β_m, ε_m, ξ_m, u_m). The
    refresh noises of all K transitions are drawn at once: in a rough (noisy) CPU timing one
    vectorized draw was cheaper than K small ones inside the loop; it costs K·d floats per
    chain, no more than the residuals reverse mode keeps anyway.
    """
    loc, damping, momentum_scale = params.loc, params.damping, params.momentum_scale
    dim, num_transitions = loc.shape[-1], params.betas.shape[0]
    momentum = momentum_scale * jax.random.normal(key_momentum, (dim,), loc.dtype)
    move = _make_move(logdensity_fn, params, num_leapfrog_steps, corrected, integrator)
    refresh_scale = jnp.sqrt(1.0 - damping**2) * momentum_scale

    def refresh(state, noise):
        return state._replace(momentum=damping * state.momentum + refresh_scale * noise)

    noises = jax.random.normal(key_refresh, (num_transitions, dim), loc.dtype)
    uniforms = jax.random.uniform(key_accept, (num_transitions,), loc.dtype)
    return momentum, move, refresh, (params.betas, params.step_sizes, noises, uniforms)


def _make_move(logdensity_fn, params, num_leapfrog_steps, corrected, integrator):
    """The deterministic (or Metropolis-corrected) part of transition m.

    ``move(start, β_m, ε_m, u)`` runs the leapfrog for π_m from ``start`` (whose momentum
    was already refreshed) and returns the new state and the per-step diagnostics
    ``(log p̄ at the new position, momentum log ratio, log acceptance ratio, accepted,
    weight increment)``. The forward sampler refreshes then moves; the reverse sampler
    moves then refreshes.
    """
    loc, scale, momentum_scale, drift_scale = (
        params.loc, params.scale, params.momentum_scale, params.drift_scale
    )
    force_limit = params.force_limit
    loc_slope, log_scale_slope = params.bridge_loc_slope, params.bridge_log_scale_slope
    value_and_grad = jax.value_and_grad(logdensity_fn)
    target_grad = jax.grad(logdensity_fn)

    def move(start, beta, step_size, uniform):
        bridge_loc, bridge_scale = bridge_gaussian(beta, loc, scale, loc_slope, log_scale_slope)

        def bridge_grad(z, grad_target):
            force = (1.0 - beta) * gaussian_grad_logpdf(z, bridge_loc, bridge_scale) + beta * grad_target
            if force_limit is None:
                return force
            return force_limit * jnp.tanh(force / force_limit)

        def bridge_logdensity(z, logdensity_target):
            return (1.0 - beta) * gaussian_logpdf(z, bridge_loc, bridge_scale) + beta * logdensity_target

        if integrator == "position_verlet":
            z, rho = drift_kick_drift(
                start.position, start.momentum, step_size, momentum_scale, target_grad,
                bridge_grad, num_leapfrog_steps, drift_scale,
            )
            proposal = IntegratorState(z, rho, logdensity_fn(z), None)
        else:
            proposal = leapfrog(
                start, step_size, momentum_scale, value_and_grad, bridge_grad,
                num_leapfrog_steps, drift_scale,
            )
        momentum_log_ratio = kinetic_log_density(
            proposal.momentum, momentum_scale
        ) - kinetic_log_density(start.momentum, momentum_scale)
        log_pi_start = bridge_logdensity(start.position, start.target_logdensity)
        log_pi_proposal = bridge_logdensity(proposal.position, proposal.target_logdensity)
        log_accept_ratio = log_pi_proposal - log_pi_start + momentum_log_ratio

        if corrected:
            # A NaN ratio compares False, so a diverged proposal is rejected.
            accepted = jnp.log(uniform) < log_accept_ratio
            rejected = start._replace(momentum=-start.momentum)
            new_state = jax.tree.map(
                lambda a, b: jnp.where(accepted, a, b), proposal, rejected
            )
            increment = jnp.where(accepted, log_pi_start - log_pi_proposal, 0.0)
        else:
            accepted = jnp.asarray(True)
            new_state = proposal
            increment = momentum_log_ratio
        step_info = (
            new_state.target_logdensity,
            momentum_log_ratio,
            log_accept_ratio,
            accepted,
            increment,
        )
        return new_state, step_info

    return move


def reverse_annealed_sample(
    rng_key: jax.Array,
    logdensity_fn: LogDensityFn,
    params: AnnealingParams,
    position: jax.Array,
    *,
    num_leapfrog_steps: int = 1,
    corrected: bool = False,
    integrator: str = "velocity_verlet",
) -> tuple[jax.Array, jax.Array, AnnealingInfo]:
    """Run the annealing chain *backwards* from ``position`` (Grosse et al.'s reverse AIS).

    The path z_{K+1} → z_K → ... → z_1 is drawn from the backward process that defines
    the UHA (or, with ``corrected=True``, the Hamiltonian AIS) weight: (z_{K+1}, ρ_{K+1})
    ~ p(z) S(ρ), then for m = K, ..., 1 the reversal of transition m (the leapfrog for
    π_m, Metropolis-corrected if asked, followed by a partial momentum refresh; working
    with negated momenta makes the reversal the same code as the forward move). The
    returned log weight is the forward weight *of that path*, so that

    * if ``position`` is an exact draw from the posterior p = p̄ / Z, then
      E[log w] ≥ log Z: a stochastic **upper** bound (the gap is the KL divergence
      from the backward to the forward path distribution), and E[1 / w] = 1 / Z;
    * together with the forward sampler's lower bound it sandwiches log Z.

    The bound is only valid for exact posterior draws: with approximate ones (e.g. short
    or unconverged MCMC) it can fall below log Z.

    Returns:
        ``(z_1, log w, info)``; ``info`` is ordered by transition m = 1..K like the
        forward sampler's, with ``info.initial_position = z_1``, ``info.log_q_initial =
        log q(z_1)``, ``info.target_logdensity[m-1] = log p̄(z_m)`` and
        ``info.log_accept_ratio`` / ``info.accepted`` those of the backward moves.
    """
    key_momentum, key_refresh, key_accept = jax.random.split(rng_key, 3)
    position = jnp.asarray(position, params.loc.dtype)
    momentum, move, refresh, steps = _chain_parts(
        logdensity_fn, params, key_momentum, key_refresh, key_accept,
        num_leapfrog_steps, corrected, integrator,
    )
    state = _initial_state(logdensity_fn, position, momentum, integrator)
    final_logdensity = state.target_logdensity

    def transition(state, step):
        beta, step_size, noise, uniform = step
        moved, step_info = move(state, beta, step_size, uniform)
        return refresh(moved, noise), step_info

    first_state, per_step = jax.lax.scan(transition, state, steps, reverse=True)
    log_q_initial = gaussian_logpdf(first_state.position, params.loc, params.scale)
    # Each backward move's increment is the forward increment with start and end swapped.
    increments = -per_step[-1]
    log_weight = final_logdensity - log_q_initial + jnp.sum(increments)
    target_logdensity, momentum_log_ratio, log_accept_ratio, accepted, _ = per_step
    info = AnnealingInfo(
        first_state.position, log_q_initial, target_logdensity,
        # In forward terms, log S(ρ_{m+1}) - log S(ρ'_m) is minus the backward move's.
        -momentum_log_ratio, log_accept_ratio, accepted, increments,
    )
    return first_state.position, log_weight, info


def uha_sample(
    rng_key, logdensity_fn, params, *, num_leapfrog_steps=1, remat=False,
    integrator="velocity_verlet",
):
    """UHA draw (differentiable). See :func:`annealed_sample`."""
    return annealed_sample(
        rng_key, logdensity_fn, params,
        num_leapfrog_steps=num_leapfrog_steps, corrected=False, remat=remat,
        integrator=integrator,
    )


def hais_sample(
    rng_key, logdensity_fn, params, *, num_leapfrog_steps=1, integrator="velocity_verlet"
):
    """Hamiltonian AIS draw with the same parameters (Metropolis-corrected, unbiased).

    Gradients are stopped: the corrected weight is not differentiable.
    """
    params = jax.lax.stop_gradient(params)
    return annealed_sample(
        rng_key, logdensity_fn, params,
        num_leapfrog_steps=num_leapfrog_steps, corrected=True, remat=False,
        integrator=integrator,
    )
