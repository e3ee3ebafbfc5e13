"""q's log density at its own draws, from their noise (``gaussian_logpdf_of_draw``).

A full-rank q's draw is z = m + L e; its log density is −|e|²/2 − log |det L| − (d/2) log 2π.
Computed by whitening z again (a triangular solve), float32 rounding at an ill-conditioned
L is amplified by |·|²: a full-rank warm start on madelon (d = 501) followed that error
until its factor's condition number was 10²⁰ and its "ELBO" +10²⁸ (the data's log Z is
about −2400), and ``svi.init`` then returned NaN parameters. Here:

* the noise form equals the solve form (value and gradient) where both are exact (float64);
* at a float32 factor of condition number above 10⁶ it still equals the float64 value,
  and so do the places that score q's own draws: ``gaussian_elbo`` (plain VI), the
  warm start's scoring (``oracle_log_weights``), its VI's loss (``_fit_starts``) and the
  chain's start (``annealed_sample`` at K = 0). Each, reverted alone to the solve, fails
  its test.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_uha.core import gaussian_elbo, gaussian_logpdf, gaussian_logpdf_of_draw, gaussian_sample
from numpyro_uha.core.warm_start import _fit_starts, oracle_log_weights, rows_oracle

from tests._compat import enable_x64

D = 8
LOG_2PI = math.log(2.0 * math.pi)


def _ill_factor():
    """A lower-triangular factor whose rows are nearly parallel (a covariance with
    correlations within 10⁻⁶ of 1), condition number above 10⁶, entries of order 1."""
    rng = np.random.default_rng(0)
    L = np.tril(np.ones((D, D))) + 0.05 * np.tril(rng.normal(size=(D, D)), -1)
    L[np.diag_indices(D)] = 10.0 ** -np.linspace(0, 3.5, D)
    L[0, 0] = 1.0
    assert np.linalg.cond(L) > 1e6
    return L


def _exact_logq(noise, L):
    noise = np.asarray(noise, np.float64)
    return -0.5 * np.sum(noise**2, -1) - np.sum(np.log(np.abs(np.diag(L)))) - 0.5 * D * LOG_2PI


def _target(z):
    return -0.5 * jnp.sum(z**2, axis=-1)


@pytest.mark.parametrize("full_rank", [False, True])
def test_noise_form_equals_the_solve_form_in_float64(full_rank):
    rng = np.random.default_rng(1)
    with enable_x64():
        loc = jnp.asarray(rng.normal(size=D))
        if full_rank:
            scale = jnp.asarray(np.tril(rng.normal(size=(D, D)), -1) + np.diag(rng.uniform(0.5, 2, D)))
        else:
            scale = jnp.asarray(rng.uniform(0.5, 2, D))
        noise = jnp.asarray(rng.normal(size=(5, D)))

        def by_solve(loc, scale):
            zs = jax.vmap(lambda e: gaussian_sample(e, loc, scale))(noise)
            return jnp.sum(jax.vmap(lambda z: gaussian_logpdf(z, loc, scale))(zs) * jnp.arange(1.0, 6.0))

        def by_noise(loc, scale):
            return jnp.sum(jax.vmap(lambda e: gaussian_logpdf_of_draw(e, loc, scale))(noise) * jnp.arange(1.0, 6.0))

        np.testing.assert_allclose(by_noise(loc, scale), by_solve(loc, scale), rtol=1e-12)
        for a, b in zip(jax.grad(by_noise, (0, 1))(loc, scale), jax.grad(by_solve, (0, 1))(loc, scale)):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_float32_draw_density_at_an_ill_conditioned_factor():
    L = _ill_factor()
    noise = np.random.default_rng(2).normal(size=(64, D))
    got = jax.vmap(lambda e: gaussian_logpdf_of_draw(e, jnp.zeros(D), jnp.asarray(L, jnp.float32)))(
        jnp.asarray(noise, jnp.float32)
    )
    np.testing.assert_allclose(np.asarray(got), _exact_logq(noise, L), rtol=1e-5)


def test_plain_vi_elbo_at_an_ill_conditioned_factor():
    L = _ill_factor()
    key = jax.random.PRNGKey(3)
    got = gaussian_elbo(key, _target, jnp.zeros(D), jnp.asarray(L, jnp.float32), num_particles=64)
    noise = np.asarray(jax.random.normal(key, (64, D), jnp.float32), np.float64)
    z = noise @ L.T
    want = np.mean(-0.5 * np.sum(z**2, -1) - _exact_logq(noise, L))
    assert abs(float(got) - want) < 1e-3 * max(1.0, abs(want))


def test_warm_start_scoring_at_an_ill_conditioned_factor():
    L = _ill_factor()
    key = jax.random.PRNGKey(4)
    got = oracle_log_weights(rows_oracle(_target), key, jnp.zeros(D), jnp.asarray(L, jnp.float32), 48, 16)
    noise = np.asarray(jax.random.normal(key, (48, D), jnp.float32), np.float64)
    z = noise @ L.T
    want = -0.5 * np.sum(z**2, -1) - _exact_logq(noise, L)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-3)


def test_warm_start_vi_loss_at_an_ill_conditioned_factor():
    """The VI's first loss from a start whose unit factor is ill-conditioned (one start;
    z = start + scale ⊙ u, u = L e) against the float64 value at the same noise."""
    L = _ill_factor()
    key = jax.random.PRNGKey(5)
    particles, steps = 16, 3
    start, scale = np.full(D, 0.5), np.full(D, 2.0)
    carry = _fit_starts(
        rows_oracle(_target), True, key, jnp.asarray(start[None], jnp.float32),
        jnp.asarray(scale[None], jnp.float32), jnp.asarray(L[None], jnp.float32), True, steps,
        1e-3, particles, iterations=1,
    )
    first_loss = float(np.asarray(carry[2])[0, 0])
    noise = np.asarray(jax.random.normal(jax.random.split(key, steps)[0], (particles, D), jnp.float32), np.float64)
    z = start + scale * (noise @ L.T)
    # the VI's loss is in u-coordinates (log p̄ there lacks Σ log s): −mean(log p̄(z) − log q_u(u))
    want = -np.mean(-0.5 * np.sum(z**2, -1) - _exact_logq(noise, L))
    assert abs(first_loss - want) < 1e-3 * max(1.0, abs(want))


def test_chain_start_weight_at_an_ill_conditioned_factor():
    """The chain's log q at its own start (K = 0: log w = log p̄(z₀) − log q(z₀)) from the
    start's noise, against float64."""
    from numpyro_uha.core import annealed_sample, make_params
    from numpyro_uha.core.annealing import _start_noise

    L = _ill_factor()
    key = jax.random.PRNGKey(6)
    params = make_params(jnp.zeros(D, jnp.float32), jnp.asarray(L, jnp.float32), num_transitions=0)
    z, log_w, _ = annealed_sample(key, _target, params)
    noise = _start_noise(key, D, jnp.float32)
    want = -0.5 * np.sum(np.asarray(z, np.float64) ** 2) - _exact_logq(noise, L)
    assert abs(float(log_w) - want) < 1e-3 * max(1.0, abs(want))
