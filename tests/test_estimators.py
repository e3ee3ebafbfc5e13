"""Evaluation layer on a conjugate model whose log Z is known in closed form."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
import scipy.stats
from numpyro.infer import SVI, Trace_ELBO

from numpyro_uha import UHAGuide
from numpyro_uha.core import make_params
from numpyro_uha.evaluation import (
    annealed_hais,
    annealed_log_z,
    annealed_sandwich,
    extrapolate,
    hais,
    hais_grid_search,
    log_z,
    sandwich,
)

DIM, N_OBS, PRIOR_SD, NOISE_SD = 3, 20, 1.5, 2.0


def conjugate_model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, PRIOR_SD).expand([DIM]).to_event(1))
    numpyro.sample("y", dist.Normal(mu, NOISE_SD).to_event(1), obs=y)


Y = jnp.asarray(np.random.default_rng(0).normal(1.0, NOISE_SD, size=(N_OBS, DIM)), jnp.float32)


def true_log_z(y=Y):
    """Each column of y is N(0, σ² I + s0² 1 1ᵀ) marginally."""
    cov = NOISE_SD**2 * np.eye(N_OBS) + PRIOR_SD**2 * np.ones((N_OBS, N_OBS))
    return sum(
        scipy.stats.multivariate_normal(np.zeros(N_OBS), cov).logpdf(np.asarray(y[:, j], np.float64))
        for j in range(DIM)
    )


def posterior_moments(y=Y):
    precision = 1 / PRIOR_SD**2 + N_OBS / NOISE_SD**2
    mean = np.asarray(y, np.float64).sum(0) / NOISE_SD**2 / precision
    return mean, np.full(DIM, precision**-0.5)


def exact_posterior_draws(num, seed):
    mean, sd = posterior_moments()
    return mean + sd * np.random.default_rng(seed).normal(size=(num, DIM))


def logdensity(z):
    prior = dist.Normal(0.0, PRIOR_SD).log_prob(z).sum()
    return prior + dist.Normal(z, NOISE_SD).log_prob(Y).sum()


@pytest.fixture(scope="module")
def trained():
    guide = UHAGuide(conjugate_model, K=8, warm_start_steps=500)
    svi = SVI(conjugate_model, guide, optax.adam(3e-3), Trace_ELBO())
    result = svi.run(jax.random.PRNGKey(0), 300, Y, progress_bar=False)
    return guide, result.params


def test_guide_log_z_agrees_with_closed_form(trained):
    guide, params = trained
    est = log_z(guide, jax.random.PRNGKey(1), params, Y, num_draws=4000)
    truth = true_log_z()
    assert est.num_draws == 4000 and est.num_transitions == 8
    # Both are lower bounds in expectation ...
    assert est.elbo < truth + 3 * est.elbo_se
    # ... and for this Gaussian posterior the trained guide is close to exact, so the IW
    # estimate is consistent within its standard error and the ELBO's gap is small.
    assert abs(est.iw - truth) < 4 * est.iw_se
    assert truth - est.elbo < 0.05, (est, truth)


def test_core_log_z_agrees_with_closed_form():
    """The core-level estimator with q set to the exact posterior: the UHA bridges are all
    the posterior, so only the leapfrog's energy error separates the ELBO from log Z."""
    mean, sd = posterior_moments()
    params = make_params(jnp.asarray(mean, jnp.float32), jnp.asarray(sd, jnp.float32),
                         num_transitions=4, step_size=0.1, momentum_scale=jnp.asarray(1 / sd, jnp.float32))
    est = annealed_log_z(jax.random.PRNGKey(2), logdensity, params, 4000)
    truth = true_log_z()
    assert abs(est.iw - truth) < 4 * est.iw_se
    assert est.elbo < truth + 3 * est.elbo_se
    assert truth - est.elbo < 0.01


def test_hais_is_unbiased_for_z():
    """Untrained parameters with a too-wide q: E[exp(log w)] = Z all the same."""
    params = make_params(jnp.zeros(DIM), jnp.full(DIM, 1.0), num_transitions=6, step_size=0.3,
                         damping=0.8)
    result = annealed_hais(jax.random.PRNGKey(3), logdensity, params, 20_000)
    ratio = np.exp(result.log_weights - true_log_z())
    se = ratio.std(ddof=1) / math.sqrt(ratio.size)
    assert abs(ratio.mean() - 1) < 4 * se, (ratio.mean(), se)
    assert result.acceptance_rate.shape == (6,)
    assert np.all((result.acceptance_rate > 0) & (result.acceptance_rate <= 1))


def _check_first_acceptance(guide, params, result, num_draws):
    """HAIS's first move starts from the same (z_1, ρ'_1) law as UHA's, so its acceptance
    rate is E[min(1, exp(log accept ratio))] of the UHA draws' first move."""
    draws = guide.sample_posterior_with_log_weights(
        jax.random.PRNGKey(5), params, Y, sample_shape=(num_draws,)
    )
    prob = np.exp(np.minimum(0.0, np.asarray(draws.info.log_accept_ratio[:, 0], np.float64)))
    rate = float(result.acceptance_rate[0])
    se = math.sqrt((rate * (1 - rate) + prob.var(ddof=1)) / num_draws)
    assert abs(rate - prob.mean()) < 4 * se + 1e-3, (rate, prob.mean(), se)


def test_guide_hais_reports_acceptance(trained):
    guide, params = trained
    num_draws = 4000
    result = hais(guide, jax.random.PRNGKey(4), params, Y, num_draws=num_draws)
    truth = true_log_z()
    assert result.acceptance_rate.shape == (guide.K,)
    # Trained steps with a second-order energy error: HAIS accepts almost everything
    # (0.999 measured).
    assert result.mean_acceptance > 0.98, result.acceptance_rate
    _check_first_acceptance(guide, params, result, num_draws)
    assert abs(result.log_z.iw - truth) < 4 * result.log_z.iw_se
    assert "acceptance" in str(result)

    # Steps 5x larger in units of the posterior scale (and a stability ceiling 1.5x
    # higher, which would otherwise hold them near its own 20 % rejection) and a
    # non-unit δ: 20-60 % of the moves are rejected, and HAIS's estimate of log Z is
    # still consistent.
    rough = dict(params)
    rough["auto_momentum_scale"] = params["auto_momentum_scale"] / 5.0
    rough["auto_stability_ceiling"] = params["auto_stability_ceiling"] * 1.5
    rough["auto_drift_scale"] = jnp.array([1.5, 0.7, 1.2])
    result = hais(guide, jax.random.PRNGKey(4), rough, Y, num_draws=num_draws)
    assert 0.2 < 1 - result.mean_acceptance < 0.6, result.acceptance_rate
    _check_first_acceptance(guide, rough, result, num_draws)
    assert abs(result.log_z.iw - truth) < 4 * result.log_z.iw_se, (result.log_z, truth)


@pytest.mark.parametrize("corrected", [False, True], ids=["uha", "hais"])
def test_sandwich_brackets_the_truth(trained, corrected):
    guide, params = trained
    draws = {"mu": jnp.asarray(exact_posterior_draws(3000, seed=5), jnp.float32)}
    bounds = sandwich(guide, jax.random.PRNGKey(6), params, draws, Y, corrected=corrected)
    truth = true_log_z()
    assert bounds.lower.elbo < truth + 3 * bounds.lower.elbo_se
    assert bounds.upper > truth - 3 * bounds.upper_se
    assert bounds.lower.iw - 4 * bounds.lower.iw_se < truth < bounds.upper_iw + 4 * bounds.upper_iw_se
    assert bounds.num_reverse == 3000
    assert "log Z in [" in str(bounds)


def test_core_sandwich_brackets_with_a_poor_q():
    """A deliberately poor q: the bracket is wide but still holds."""
    params = make_params(jnp.full(DIM, -1.0), jnp.full(DIM, 0.3), num_transitions=4, step_size=0.2)
    draws = exact_posterior_draws(4000, seed=7)
    bounds = annealed_sandwich(jax.random.PRNGKey(8), logdensity, params, draws)
    truth = true_log_z()
    assert bounds.lower.elbo < truth + 3 * bounds.lower.elbo_se
    assert bounds.upper > truth - 3 * bounds.upper_se
    assert bounds.upper - bounds.lower.elbo > 1.0  # both KL gaps are large here
    # The IW bounds bracket log Z too (Jensen on the unbiased estimates of Z and 1/Z).
    # The reverse one is the sharp check here: with UHA's momentum terms left out of the
    # weight it falls 2-3 nats below log Z (about 9 standard errors); with them it is
    # about 8 nats above.
    assert bounds.lower.iw < truth + 4 * bounds.lower.iw_se
    assert bounds.upper_iw > truth - 4 * bounds.upper_iw_se, (bounds, truth)


def test_sandwich_rejects_bad_draws(trained):
    guide, params = trained
    with pytest.raises(ValueError, match="mu"):
        sandwich(guide, jax.random.PRNGKey(0), params, {"nu": jnp.zeros((10, DIM))}, Y)
    with pytest.raises(ValueError, match="samples\\['mu'\\] has shape"):
        sandwich(guide, jax.random.PRNGKey(0), params, {"mu": jnp.zeros((10, DIM + 1))}, Y)
    params_core = make_params(jnp.zeros(DIM), jnp.ones(DIM), num_transitions=2)
    with pytest.raises(ValueError, match="NaN or inf"):
        annealed_sandwich(jax.random.PRNGKey(0), logdensity, params_core,
                          jnp.full((4, DIM), jnp.nan))
    with pytest.raises(ValueError, match="num_draws"):
        annealed_log_z(jax.random.PRNGKey(0), logdensity, params_core, 1)


def test_latent_from_samples_inverts_sample_posterior():
    def positive_model(y):
        tau = numpyro.sample("tau", dist.HalfNormal(2.0))
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        numpyro.sample("y", dist.Normal(mu, tau).to_event(1), obs=y)

    y = jnp.ones((5, 2))
    guide = UHAGuide(positive_model, K=2, warm_start_steps=0)
    svi = SVI(positive_model, guide, optax.adam(1e-3), Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(0), y)
    params = svi.get_params(state)
    draws = guide.sample_posterior_with_log_weights(jax.random.PRNGKey(1), params, y, sample_shape=(7,))
    latent = guide.latent_from_samples(draws.samples, y, params=params)
    np.testing.assert_allclose(latent, draws.latent, rtol=1e-4, atol=1e-5)


def test_latent_from_samples_handles_constrained_shapes():
    """A simplex has one more entry than its unconstrained coordinates."""
    def simplex_model(counts):
        probs = numpyro.sample("probs", dist.Dirichlet(jnp.ones(3)))
        numpyro.sample("counts", dist.Multinomial(total_count=10, probs=probs), obs=counts)

    counts = jnp.array([2.0, 3.0, 5.0])
    guide = UHAGuide(simplex_model, K=2, warm_start_steps=0)
    svi = SVI(simplex_model, guide, optax.adam(1e-3), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), counts))
    draws = guide.sample_posterior_with_log_weights(jax.random.PRNGKey(1), params, counts, sample_shape=(5,))
    assert draws.samples["probs"].shape == (5, 3) and draws.latent.shape == (5, 2)
    latent = guide.latent_from_samples(draws.samples, counts, params=params)
    np.testing.assert_allclose(latent, draws.latent, rtol=1e-4, atol=1e-5)


def test_grid_search_hits_rejection_targets_and_picks_the_best():
    mean, sd = posterior_moments()
    result = hais_grid_search(
        jax.random.PRNGKey(9), logdensity, jnp.asarray(mean, jnp.float32),
        jnp.asarray(2 * sd, jnp.float32), 4, num_draws=500, num_pilot=512,
    )
    assert len(result.table) == 9
    for row in result.table:
        # 512 pilot chains × 4 transitions: binomial SE of a rate ≤ 0.011; bisection
        # precision on log ε adds a little.
        assert abs(row["rejection"] - row["target_rejection"]) < 0.05, row
    best = max(result.table, key=lambda r: r["elbo"])
    assert float(result.best.params.damping) == pytest.approx(best["damping"])
    assert float(result.best.params.step_sizes[0]) == pytest.approx(best["step_size"], rel=1e-5)
    assert result.best.acceptance_rate.shape == (4,)
    assert abs(result.best.log_z.iw - true_log_z()) < 4 * result.best.log_z.iw_se


def test_grid_search_validates_arguments():
    with pytest.raises(ValueError, match="rejection_rates"):
        hais_grid_search(jax.random.PRNGKey(0), logdensity, jnp.zeros(DIM), jnp.ones(DIM), 2,
                         rejection_rates=(0.0, 0.5))
    with pytest.raises(ValueError, match="dampings"):
        hais_grid_search(jax.random.PRNGKey(0), logdensity, jnp.zeros(DIM), jnp.ones(DIM), 2,
                         dampings=(1.0,))


# ------------------------------------------------------------ extrapolation
def student_t_model():
    numpyro.sample("x", dist.StudentT(3.0, 0.0, 1.0).expand([5]).to_event(1))


@pytest.fixture(scope="module")
def student_t_trained():
    guide = UHAGuide(student_t_model, K=4, warm_start_steps=500)
    svi = SVI(student_t_model, guide, optax.adam(3e-3), Trace_ELBO(num_particles=4))
    result = svi.run(jax.random.PRNGKey(0), 400, progress_bar=False)
    return guide, result.params


def test_extrapolated_schedule_and_step_sizes(student_t_trained):
    guide, params = student_t_trained
    old = guide.get_annealing_params(params)
    new_guide, new_params = extrapolate(guide, params, 32)
    new = new_guide.get_annealing_params(new_params)
    assert new_guide.K == 32 and guide.K == 4  # the original is untouched
    betas = np.asarray(new.betas)
    assert betas.shape == (32,)
    edges = np.concatenate([[0.0], betas, [1.0]])
    assert np.all(np.diff(edges) > 0)
    # Piecewise-linear interpolation of the old schedule at x = k / 33.
    old_edges = np.concatenate([[0.0], np.asarray(old.betas), [1.0]])
    expected = np.interp(np.arange(1, 33) / 33, np.arange(6) / 5, old_edges)
    np.testing.assert_allclose(betas, expected, rtol=1e-4, atol=1e-6)
    # ε(β) = the old curve ε_old(β) times log 5 / log 33, at every new β; η carried over.
    from numpyro_uha.core import step_sizes_from_beta

    factor = math.log(5) / math.log(33)
    old_curve = step_sizes_from_beta(
        new.betas, params["auto_step_size"], params["auto_step_size_slope"], guide.max_step_size
    )
    np.testing.assert_allclose(np.asarray(new.step_sizes), factor * np.asarray(old_curve), rtol=1e-5)
    assert float(new.step_sizes.max()) < new_guide.max_step_size
    np.testing.assert_allclose(np.asarray(new.damping), np.asarray(old.damping))


# A Gaussian-started UHA to a Student-t (heavier tails than the proposal): the weights'
# k̂ is ≈ 0.76 and log_z rightly warns; the test is about the ELBO.
@pytest.mark.filterwarnings("ignore::numpyro_uha.UHAFitWarning")
def test_extrapolation_to_more_steps_tightens_the_bound(student_t_trained):
    guide, params = student_t_trained
    new_guide, new_params = extrapolate(guide, params, 32)
    before = log_z(guide, jax.random.PRNGKey(10), params, num_draws=4000)
    after = log_z(new_guide, jax.random.PRNGKey(11), new_params, num_draws=4000)
    # log Z = 0 exactly for a normalized Student-t.
    assert after.elbo < 3 * after.elbo_se
    assert after.elbo - before.elbo > 3 * math.hypot(before.elbo_se, after.elbo_se), (before, after)
    samples = new_guide.sample_posterior(jax.random.PRNGKey(12), new_params, sample_shape=(10,))
    assert samples["x"].shape == (10, 5)


def test_extrapolation_with_frozen_schedule():
    guide = UHAGuide(student_t_model, K=3, warm_start_steps=0, frozen=("schedule", "step_size"))
    svi = SVI(student_t_model, guide, optax.adam(1e-3), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0)))
    new_guide, new_params = guide.extrapolate(params, 7)
    new = new_guide.get_annealing_params(new_params)
    np.testing.assert_allclose(np.asarray(new.betas), np.arange(1, 8) / 8, rtol=1e-5)
    factor = math.log(4) / math.log(8)
    np.testing.assert_allclose(np.asarray(new.step_sizes), guide.init_step_size * factor, rtol=1e-5)
    with pytest.raises(ValueError, match="K"):
        guide.extrapolate(params, 0)
    with pytest.warns(RuntimeWarning, match="larger K"):
        guide.extrapolate(params, 2)
