"""Reverse (backward-path) annealing: the upper half of the log Z sandwich."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_uha.core import reverse_annealed_sample

from tests.core.test_annealing import (
    DIM,
    LOG_Z,
    TARGET_MEAN,
    TARGET_STD,
    draw_log_weights,
    gaussian_target,
    random_params,
)


def reverse_log_weights(params, num_draws, seed=0, **kwargs):
    key_pos, key_chain = jax.random.split(jax.random.PRNGKey(seed))
    exact = TARGET_MEAN + TARGET_STD * jax.random.normal(key_pos, (num_draws, DIM))
    keys = jax.random.split(key_chain, num_draws)
    run = jax.jit(jax.vmap(
        lambda k, z: reverse_annealed_sample(k, gaussian_target, params, z, **kwargs)[1]
    ))
    return np.asarray(run(keys, exact), dtype=np.float64)


def max_leapfrog_frequency_step(params):
    """max over transitions and coordinates of ε_m δ_i ω_i / σ_i, with ω_i² the
    curvature of −log π_m (diagonal Gaussian bridges and target): the leapfrog is stable
    for the Gaussian π_m where this is below 2."""
    betas = np.asarray(params.betas)[:, None]
    bridge_scale = np.exp(betas * np.asarray(params.bridge_log_scale_slope)) * np.asarray(
        params.scale
    )
    curvature = (1 - betas) / bridge_scale**2 + betas / np.asarray(TARGET_STD) ** 2
    delta = 1.0 if params.drift_scale is None else np.asarray(params.drift_scale)
    steps = np.asarray(params.step_sizes)[:, None] * delta
    return float(np.max(steps * np.sqrt(curvature) / np.asarray(params.momentum_scale)))


@pytest.mark.parametrize("integrator", ["velocity_verlet", "position_verlet"])
@pytest.mark.parametrize("corrected", [False, True], ids=["uha", "hais"])
def test_reverse_weights_estimate_one_over_z(corrected, integrator):
    """Started from exact posterior draws, E[1/w] = 1/Z for any parameters.

    q is about as wide as the target: with ``random_params``' wider q, 1/w ~ q/p has no
    finite variance (E_p[(q/p)²] needs q's variances below twice the target's), its
    sample mean falls short of 1/Z more often than the standard error says, and the test
    was only passing by luck of the draw."""
    q_scale = TARGET_STD * np.random.default_rng(3).uniform(0.8, 1.2, DIM)
    params = random_params(3, num_transitions=5, drift=True)
    params = params._replace(
        scale=jnp.asarray(q_scale, jnp.float32), step_sizes=0.5 * params.step_sizes
    )
    # Halved steps keep every coordinate's leapfrog stable (per-coordinate step times
    # the bridge's frequency below 2); at the full steps one coordinate is not, UHA's
    # weights then have no usable variance in either direction, and no sample mean
    # tests anything.
    assert max_leapfrog_frequency_step(params) < 1.5
    log_w = reverse_log_weights(params, 20_000, corrected=corrected, integrator=integrator)
    inv_w = np.exp(-(log_w - LOG_Z))  # = Z / w, mean one
    se = inv_w.std(ddof=1) / math.sqrt(inv_w.size)
    assert abs(inv_w.mean() - 1.0) < 4 * se, (inv_w.mean(), se)


@pytest.mark.parametrize("corrected", [False, True], ids=["uha", "hais"])
def test_sandwich_brackets_log_z(corrected):
    params = random_params(4, num_transitions=8)
    lower = draw_log_weights(params, 5000, seed=1, corrected=corrected)
    upper = reverse_log_weights(params, 5000, seed=2, corrected=corrected)
    se_lower = lower.std(ddof=1) / math.sqrt(lower.size)
    se_upper = upper.std(ddof=1) / math.sqrt(upper.size)
    assert lower.mean() < LOG_Z + 3 * se_lower
    assert upper.mean() > LOG_Z - 3 * se_upper
    # Both gaps are KL divergences: strictly positive for these untrained parameters.
    assert upper.mean() - lower.mean() > 3 * math.hypot(se_lower, se_upper)


def _replay_backward(key, logdensity_fn, params, z_end, corrected, integrator):
    """An independent transcription of the backward process that defines the weight,
    drawing the same random numbers as ``reverse_annealed_sample`` (diagonal q only).

    Forward transition m maps (z_m, ρ_m) to ρ'_m = η ρ_m + sqrt(1 − η²) Σ^(1/2) ξ_m, then
    (z_{m+1}, ρ_{m+1}) = T_m(z_m, ρ'_m) (the leapfrog for π_m, per-coordinate step ε_m δ;
    HAIS: that proposal if accepted, else (z_m, −ρ'_m)). The backward process starts at
    (z_{K+1}, ρ_{K+1}) ~ p ⊗ S and undoes each transition: T_m⁻¹ = flip ∘ T_m ∘ flip
    (HAIS: accepted with the Metropolis probability, else (z, −ρ)), then the refresh,
    which is reversible with respect to S. Returns (z_1, forward log weight of the path,
    number of rejected backward moves)."""
    loc, scale, betas, step_sizes, eta, sigma, loc_slope, log_scale_slope, delta = params[:9]
    delta = jnp.ones_like(loc) if delta is None else delta
    num_transitions, dim = betas.shape[0], loc.shape[0]
    key_momentum, key_refresh, key_accept = jax.random.split(key, 3)
    noises = jax.random.normal(key_refresh, (num_transitions, dim))
    uniforms = jax.random.uniform(key_accept, (num_transitions,))
    # The sampler works with negated momenta; S is symmetric, so ρ_{K+1} = −Σ^(1/2) ξ is
    # as good a draw from S as +Σ^(1/2) ξ, and the sign keeps the random numbers aligned.
    rho = -sigma * jax.random.normal(key_momentum, (dim,))
    z = jnp.asarray(z_end)
    log_s = lambda r: -0.5 * jnp.sum((r / sigma) ** 2)

    @jax.jit
    def log_pi(x, m):
        beta = betas[m]
        bridge = jax.scipy.stats.norm.logpdf(
            x, loc + beta * loc_slope, jnp.exp(beta * log_scale_slope) * scale
        ).sum()
        return (1 - beta) * bridge + beta * logdensity_fn(x)

    @jax.jit
    def leapfrog(x, r, m):
        h = step_sizes[m] * delta  # the per-coordinate step
        grad = jax.grad(lambda y: log_pi(y, m))
        if integrator == "velocity_verlet":
            r = r + 0.5 * h * grad(x)
            x = x + h * r / sigma**2
            r = r + 0.5 * h * grad(x)
        else:
            x = x + 0.5 * h * r / sigma**2
            r = r + h * grad(x)
            x = x + 0.5 * h * r / sigma**2
        return x, r

    log_w = logdensity_fn(z)
    rejections = 0
    for m in reversed(range(num_transitions)):
        x, r = leapfrog(z, -rho, m)
        x, r = x, -r  # T_m⁻¹(z_{m+1}, ρ_{m+1})
        if corrected:
            log_ratio = log_pi(x, m) + log_s(r) - log_pi(z, m) - log_s(rho)
            if np.log(float(uniforms[m])) < float(log_ratio):
                log_w = log_w + log_pi(x, m) - log_pi(z, m)
                z, rho_prime = x, r
            else:
                rejections += 1
                rho_prime = -rho
        else:
            log_w = log_w + log_s(rho) - log_s(r)
            z, rho_prime = x, r
        rho = eta * rho_prime - jnp.sqrt(1 - eta**2) * sigma * noises[m]
    log_w = log_w - jax.scipy.stats.norm.logpdf(z, loc, scale).sum()
    return z, log_w, rejections


@pytest.mark.parametrize("integrator", ["velocity_verlet", "position_verlet"])
@pytest.mark.parametrize("corrected", [False, True], ids=["uha", "hais"])
def test_reverse_weight_matches_an_independent_replay_of_the_backward_path(
    corrected, integrator
):
    """The reverse sampler's z_1 and log w against a plain-Python backward process built
    from the definitions (its own leapfrog, bridge and momentum bookkeeping), with δ, Σ
    and bridges all non-trivial; for HAIS at step sizes where some backward moves are
    rejected and some accepted, so that both branches are checked."""
    from tests.core.test_hais import REJECTING_STEP, rejecting_params

    params = rejecting_params(REJECTING_STEP[integrator])
    z_end = TARGET_MEAN + 0.5 * TARGET_STD * jnp.array([1.0, -0.5, 0.3, 1.2])
    total_rejections = 0
    for seed in range(3):
        key = jax.random.PRNGKey(seed)
        z1, log_w, info = reverse_annealed_sample(
            key, gaussian_target, params, z_end, corrected=corrected, integrator=integrator
        )
        z1_ref, log_w_ref, rejections = _replay_backward(
            key, gaussian_target, params, z_end, corrected, integrator
        )
        np.testing.assert_allclose(z1, z1_ref, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(log_w, log_w_ref, rtol=1e-5, atol=1e-3)
        np.testing.assert_allclose(info.initial_position, z1_ref, rtol=1e-4, atol=1e-4)
        assert int((~info.accepted).sum()) == rejections
        total_rejections += rejections
    if corrected:
        assert 0 < total_rejections < 60, total_rejections
    # info is in forward terms: target_logdensity[m-1] = log p̄(z_m), the first at z_1.
    np.testing.assert_allclose(info.target_logdensity[0], gaussian_target(z1), rtol=1e-5)
    assert info.target_logdensity.shape == (20,)


@pytest.mark.parametrize("integrator", ["velocity_verlet", "position_verlet"])
def test_reverse_hais_estimates_one_over_z_with_frequent_rejections(integrator):
    """E[1/w] = 1/Z from exact posterior draws where 20-60 % of the backward moves are
    rejected (the reverse counterpart of ``test_hais_is_unbiased_with_frequent_rejections``).
    q is about as wide as the target so that 1/w has a finite variance."""
    from tests.core.test_hais import rejecting_params

    # With q as narrow as the target the bridges are narrower too: smaller steps give
    # 35-45 % rejection here.
    step = {"velocity_verlet": 0.55, "position_verlet": 0.5}[integrator]
    params = rejecting_params(step, q_scale=TARGET_STD)
    key_pos, key_chain = jax.random.split(jax.random.PRNGKey(4))
    num_draws = 50_000
    exact = TARGET_MEAN + TARGET_STD * jax.random.normal(key_pos, (num_draws, DIM))
    run = jax.jit(jax.vmap(lambda k, z: reverse_annealed_sample(
        k, gaussian_target, params, z, corrected=True, integrator=integrator
    )[1:]))
    log_w, info = run(jax.random.split(key_chain, num_draws), exact)
    rejection = 1.0 - float(np.asarray(info.accepted).mean())
    assert 0.2 < rejection < 0.6, rejection
    inv_w = np.exp(-(np.asarray(log_w, np.float64) - LOG_Z))
    se = inv_w.std(ddof=1) / math.sqrt(inv_w.size)
    assert se < 0.02, se
    assert abs(inv_w.mean() - 1.0) < 4 * se, (inv_w.mean(), se, rejection)
