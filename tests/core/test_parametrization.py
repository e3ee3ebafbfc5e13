import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_uha.core import (
    betas_from_logits,
    fit_gaussian,
    gaussian_grad_logpdf,
    gaussian_logpdf,
    interpolate_betas,
    logits_from_betas,
    step_sizes_from_beta,
)


def test_zero_logits_give_linear_schedule():
    np.testing.assert_allclose(betas_from_logits(jnp.zeros(5)), np.arange(1, 5) / 5, rtol=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_any_logits_give_strictly_increasing_schedule_inside_unit_interval(seed):
    logits = jax.random.normal(jax.random.PRNGKey(seed), (33,)) * 3.0
    betas = np.asarray(betas_from_logits(logits))
    assert betas.shape == (32,)
    assert np.all(np.diff(betas) > 0) and betas[0] > 0 and betas[-1] < 1


def test_logits_round_trip():
    betas = jnp.array([0.05, 0.2, 0.21, 0.6, 0.99])
    np.testing.assert_allclose(betas_from_logits(logits_from_betas(betas)), betas, rtol=1e-5)


def test_logits_round_trip_row_by_row():
    # one schedule per row (the local guide's per-data-point schedules): each row is
    # its own round trip (a 2-D schedule failed with a raw concatenate error)
    logits = jax.random.normal(jax.random.PRNGKey(3), (4, 7))
    betas = betas_from_logits(logits)
    back = logits_from_betas(betas)
    assert back.shape == (4, 7)
    np.testing.assert_allclose(betas_from_logits(back), betas, atol=1e-6)
    for row in range(4):
        np.testing.assert_allclose(back[row], logits_from_betas(betas[row]), atol=1e-6)


def test_step_sizes_stay_inside_bounds_and_are_constant_without_slope():
    betas = jnp.linspace(0.01, 0.99, 10)
    flat = step_sizes_from_beta(betas, jnp.asarray(0.2), jnp.asarray(0.0), 0.5)
    np.testing.assert_allclose(flat, 0.2, rtol=1e-6)
    sloped = np.asarray(step_sizes_from_beta(betas, jnp.asarray(0.2), jnp.asarray(3.0), 0.5))
    assert np.all((sloped > 0) & (sloped < 0.5)) and np.all(np.diff(sloped) > 0)
    # An extreme slope saturates the sigmoid in float32: ε may reach ε_max but never leaves
    # [0, ε_max] and never becomes NaN.
    steep = np.asarray(step_sizes_from_beta(betas, jnp.asarray(0.2), jnp.asarray(-500.0), 0.5))
    assert np.all((steep >= 0) & (steep <= 0.5))


def test_interpolated_schedule_is_increasing_and_reproduces_itself():
    betas = betas_from_logits(jax.random.normal(jax.random.PRNGKey(0), (9,)))
    np.testing.assert_allclose(interpolate_betas(betas, 8), betas, rtol=1e-6)
    longer = np.asarray(interpolate_betas(betas, 40))
    assert np.all(np.diff(longer) > 0) and 0 < longer[0] and longer[-1] < 1


@pytest.mark.parametrize("full_rank", [False, True], ids=["diag", "fullrank"])
def test_gaussian_gradient_matches_autodiff(full_rank):
    loc = jnp.array([0.1, -0.3, 2.0])
    scale = jnp.array([0.5, 1.0, 2.0])
    if full_rank:
        scale = jnp.diag(scale) + jnp.tril(jnp.ones((3, 3)) * 0.3, -1)
    z = jnp.array([1.0, 0.0, -1.0])
    np.testing.assert_allclose(
        gaussian_grad_logpdf(z, loc, scale), jax.grad(gaussian_logpdf)(z, loc, scale), rtol=1e-5
    )


@pytest.mark.parametrize("full_rank", [False, True], ids=["diag", "fullrank"])
def test_fit_gaussian_recovers_a_gaussian_target(full_rank):
    mean, std = jnp.array([1.0, -2.0]), jnp.array([0.5, 2.0])

    def logdensity(z):
        return jnp.sum(jax.scipy.stats.norm.logpdf(z, mean, std))

    init_scale = jnp.eye(2) if full_rank else jnp.ones(2)
    fit = fit_gaussian(jax.random.PRNGKey(0), logdensity, jnp.zeros(2), init_scale, num_steps=2000, learning_rate=0.05)
    marginal = jnp.sqrt(jnp.sum(fit.scale**2, -1)) if full_rank else fit.scale
    np.testing.assert_allclose(fit.loc, mean, atol=0.1)
    np.testing.assert_allclose(marginal, std, rtol=0.1)
