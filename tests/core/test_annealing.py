"""Statistical and structural checks of the pure-JAX UHA / HAIS core."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_uha.core import (
    AnnealingParams,
    annealed_sample,
    bridge_gaussian,
    gaussian_elbo,
    gaussian_grad_logpdf,
    gaussian_logpdf,
    gaussian_sample,
    hais_sample,
    make_params,
    uha_sample,
)

DIM = 4
TARGET_MEAN = jnp.array([0.3, -0.5, 1.0, 0.0])
TARGET_STD = jnp.array([0.6, 1.0, 1.4, 0.8])
LOG_Z = 1.7


def gaussian_target(z):
    """Unnormalized N(TARGET_MEAN, diag TARGET_STD²) with normalizer exp(LOG_Z)."""
    return LOG_Z + jnp.sum(jax.scipy.stats.norm.logpdf(z, TARGET_MEAN, TARGET_STD))


def random_params(
    seed, num_transitions=6, full_rank=False, drift=False, force_limit=None, mass=False
) -> AnnealingParams:
    """Arbitrary, untrained parameters; q is wider than the target so weights have
    finite variance and the Monte Carlo standard error is meaningful. ``drift`` adds a
    non-unit drift scale δ; ``force_limit`` bounds the kick's force (per coordinate);
    ``mass`` a dense mass matrix (a random lower-triangular mass factor, with entries
    above its diagonal too, which it must ignore)."""
    rng = np.random.default_rng(seed)
    scale = rng.uniform(1.5, 2.5, DIM)
    if full_rank:
        scale = np.diag(scale) + np.tril(rng.normal(size=(DIM, DIM)) * 0.3, -1)
    factor = None
    if mass:
        factor = np.diag(rng.uniform(0.5, 2.0, DIM)) + rng.normal(size=(DIM, DIM)) * 0.5
    return make_params(
        rng.normal(size=DIM) * 0.3,
        scale,
        betas=np.sort(rng.uniform(size=num_transitions)),
        step_size=rng.uniform(0.1, 0.6, num_transitions),
        damping=rng.uniform(0.3, 0.95),
        momentum_scale=rng.uniform(0.5, 2.0, DIM),
        bridge_loc_slope=rng.normal(size=DIM) * 0.3,
        bridge_log_scale_slope=rng.normal(size=DIM) * 0.3,
        drift_scale=rng.uniform(0.5, 2.0, DIM) if drift else None,
        force_limit=None if force_limit is None else jnp.full(DIM, force_limit),
        mass_factor=factor,
    )


def draw_log_weights(params, num_draws, seed=0, **kwargs):
    keys = jax.random.split(jax.random.PRNGKey(seed), num_draws)
    sampler = jax.jit(jax.vmap(lambda k: annealed_sample(k, gaussian_target, params, **kwargs)[1]))
    return np.asarray(sampler(keys), dtype=np.float64)


CASES = [
    pytest.param(dict(full_rank=False), dict(), id="uha-diag-L1"),
    pytest.param(dict(full_rank=True), dict(), id="uha-fullrank-L1"),
    pytest.param(dict(full_rank=False), dict(num_leapfrog_steps=3), id="uha-diag-L3"),
    pytest.param(dict(full_rank=False), dict(corrected=True), id="hais-diag"),
    pytest.param(
        dict(full_rank=True), dict(corrected=True), id="hais-fullrank", marks=pytest.mark.slow
    ),
    pytest.param(dict(drift=True), dict(), id="uha-diag-drift"),
    pytest.param(dict(drift=True), dict(integrator="position_verlet"), id="uha-position-drift"),
    pytest.param(
        dict(full_rank=True), dict(integrator="position_verlet", num_leapfrog_steps=3),
        id="uha-position-fullrank-L3",
    ),
    pytest.param(
        dict(drift=True), dict(integrator="position_verlet", corrected=True),
        id="hais-position-drift",
    ),
    # a force bound of 0.5 is active on most kicks here (q is 1.5-2.5 sds wide): any
    # force of the position alone keeps the leapfrog a volume-preserving involution
    pytest.param(dict(drift=True, force_limit=0.5), dict(), id="uha-force-limit"),
    pytest.param(
        dict(full_rank=True, force_limit=0.5), dict(integrator="position_verlet"),
        id="uha-position-force-limit",
    ),
    pytest.param(
        dict(force_limit=0.5), dict(corrected=True), id="hais-force-limit", marks=pytest.mark.slow
    ),
    # a dense mass matrix (the chain in u = P⁻¹ z), with every other option on
    pytest.param(
        dict(full_rank=True, mass=True, drift=True, force_limit=0.5), dict(), id="uha-mass"
    ),
    pytest.param(
        dict(mass=True, drift=True), dict(integrator="position_verlet"), id="uha-position-mass"
    ),
    pytest.param(dict(full_rank=True, mass=True), dict(corrected=True), id="hais-mass"),
]


@pytest.mark.parametrize("param_kwargs,sample_kwargs", CASES)
def test_weight_is_unbiased_for_z(param_kwargs, sample_kwargs):
    """E[exp(log w)] = Z for arbitrary parameters: a proper importance weight."""
    params = random_params(1, **param_kwargs)
    log_w = draw_log_weights(params, 100_000, **sample_kwargs)
    ratio = np.exp(log_w - LOG_Z)
    standard_error = ratio.std() / math.sqrt(ratio.size)
    assert abs(ratio.mean() - 1.0) < 4.0 * standard_error, (ratio.mean(), standard_error)
    # The same weights, averaged in log space, lower-bound log Z.
    log_w_se = log_w.std() / math.sqrt(log_w.size)
    assert log_w.mean() < LOG_Z + 4.0 * log_w_se


def test_zero_step_size_gives_plain_elbo_exactly():
    """ε = 0 leaves z and ρ unchanged, so log w = log p̄(z₁) - log q(z₁) draw by draw."""
    params = random_params(2)._replace(step_sizes=jnp.zeros(6))
    keys = jax.random.split(jax.random.PRNGKey(3), 256)
    z, log_w, info = jax.vmap(lambda k: uha_sample(k, gaussian_target, params))(keys)
    np.testing.assert_allclose(z, info.initial_position)
    expected = jax.vmap(
        lambda z1: gaussian_target(z1) - gaussian_logpdf(z1, params.loc, params.scale)
    )(info.initial_position)
    np.testing.assert_allclose(log_w, expected, rtol=1e-6, atol=1e-6)
    # ... whose mean is the ELBO of q, estimated independently.
    elbo = gaussian_elbo(jax.random.PRNGKey(4), gaussian_target, params.loc, params.scale, 50_000)
    many = draw_log_weights(params, 50_000, seed=5)
    # Both are means of the same distribution (log p̄ - log q under q) over 50,000 draws.
    se = math.sqrt(2.0) * many.std() / math.sqrt(many.size)
    assert abs(many.mean() - float(elbo)) < 4 * se


def _algorithm3_reference(
    rng_key, logdensity_fn, params, num_leapfrog_steps=1, integrator="velocity_verlet"
):
    """Plain-Python transcription of Algorithms 3 and 5 (one draw), drawing the same
    random numbers as the scanned implementation; position Verlet swaps the leapfrog's
    order, and δ multiplies the step of every drift and every kick."""
    loc, scale, betas, step_sizes, eta, sigma, loc_slope, log_scale_slope, delta = params[:9]
    delta = 1.0 if delta is None else delta
    dim = loc.shape[0]
    key_init, key_momentum, key_refresh, _ = jax.random.split(rng_key, 4)
    noises = jax.random.normal(key_refresh, (betas.shape[0], loc.shape[0]))
    z = gaussian_sample(jax.random.normal(key_init, (dim,)), loc, scale)
    estimate = -gaussian_logpdf(z, loc, scale)
    rho = sigma * jax.random.normal(key_momentum, (dim,))
    log_s = lambda r: -0.5 * jnp.sum((r / sigma) ** 2)
    per_step = []
    for m in range(betas.shape[0]):
        beta, eps = betas[m], step_sizes[m]
        b_loc, b_scale = bridge_gaussian(beta, loc, scale, loc_slope, log_scale_slope)

        def grad_log_pi(x):
            return (1 - beta) * gaussian_grad_logpdf(x, b_loc, b_scale) + beta * jax.grad(
                logdensity_fn
            )(x)

        # 1. partial momentum refresh, leaving S = N(0, Σ) invariant
        xi = noises[m]
        rho_prime = eta * rho + jnp.sqrt(1 - eta**2) * sigma * xi
        # 2. leapfrog, then the simulator's momentum flip
        x, r = z, rho_prime
        for _ in range(num_leapfrog_steps):
            if integrator == "velocity_verlet":
                r = r + 0.5 * eps * delta * grad_log_pi(x)
                x = x + eps * delta * r / sigma**2
                r = r + 0.5 * eps * delta * grad_log_pi(x)
            else:
                x = x + 0.5 * eps * delta * r / sigma**2
                r = r + eps * delta * grad_log_pi(x)
                x = x + 0.5 * eps * delta * r / sigma**2
        z_sim, rho_sim = x, -r
        # 3. reverse the momentum
        z, rho = z_sim, -rho_sim
        increment = log_s(rho) - log_s(rho_prime)
        estimate = estimate + increment
        per_step.append((logdensity_fn(z), increment))
    estimate = estimate + logdensity_fn(z)
    return z, estimate, per_step


@pytest.mark.parametrize("integrator", ["velocity_verlet", "position_verlet"])
@pytest.mark.parametrize(
    "full_rank,drift", [(False, False), (True, False), (False, True)],
    ids=["diag", "fullrank", "diag-drift"],
)
@pytest.mark.parametrize("num_leapfrog_steps", [1, 2], ids=["L1", "L2"])
def test_scan_matches_python_loop_transcription(full_rank, drift, num_leapfrog_steps, integrator):
    params = random_params(7, num_transitions=5, full_rank=full_rank, drift=drift)
    key = jax.random.PRNGKey(11)
    z_ref, log_w_ref, per_step = _algorithm3_reference(
        key, gaussian_target, params, num_leapfrog_steps, integrator
    )
    z, log_w, info = uha_sample(
        key, gaussian_target, params, num_leapfrog_steps=num_leapfrog_steps,
        integrator=integrator,
    )
    np.testing.assert_allclose(z, z_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(log_w, log_w_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(info.target_logdensity, [p[0] for p in per_step], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(info.momentum_log_ratio, [p[1] for p in per_step], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "integrator", [pytest.param("velocity_verlet", marks=pytest.mark.slow), "position_verlet"]
)
def test_remat_changes_neither_value_nor_gradient(integrator):
    params = random_params(3, drift=True)
    key = jax.random.PRNGKey(0)

    def mean_log_w(p, remat):
        keys = jax.random.split(key, 8)
        return jnp.mean(jax.vmap(
            lambda k: uha_sample(k, gaussian_target, p, remat=remat, integrator=integrator)[1]
        )(keys))

    value, grads = jax.value_and_grad(mean_log_w)(params, False)
    value_remat, grads_remat = jax.value_and_grad(mean_log_w)(params, True)
    np.testing.assert_allclose(value, value_remat, rtol=1e-6)
    for g, g_remat in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_remat)):
        np.testing.assert_allclose(g, g_remat, rtol=1e-4, atol=1e-6)
        assert np.all(np.isfinite(g))


def test_hais_accepts_less_with_larger_steps_and_is_not_differentiated():
    small = random_params(4)._replace(step_sizes=jnp.full(6, 0.05))
    large = small._replace(step_sizes=jnp.full(6, 1.5))
    keys = jax.random.split(jax.random.PRNGKey(0), 500)
    accept = lambda p: jax.vmap(lambda k: hais_sample(k, gaussian_target, p)[2].accepted)(keys).mean()
    assert accept(small) > accept(large)
    grads = jax.grad(lambda p: hais_sample(keys[0], gaussian_target, p)[1])(small)
    assert all(float(jnp.abs(g).sum()) == 0.0 for g in jax.tree.leaves(grads))


def test_unknown_integrator_is_named_in_the_error():
    with pytest.raises(ValueError, match="integrator must be one of.*'leapfrog'"):
        uha_sample(jax.random.PRNGKey(0), gaussian_target, random_params(0), integrator="leapfrog")
