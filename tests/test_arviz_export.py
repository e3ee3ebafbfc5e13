"""ArviZ export and importance-weight diagnostics (numpyro_uha.evaluation.arviz).

The guide-based tests share one UHAGuide (K=4) fitted once to the model with a known
posterior of ``conjugate_model.py``. Every
guide draw uses the same number of draws (N_DRAWS), so the draw function compiles once.
Tolerances are a few Monte Carlo standard errors computed from the draws themselves.
"""

import math

import arviz as az
import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from conjugate_model import Y, exact_moments, fit_guide
from numpyro_uha import WeightedDraws
from numpyro_uha.evaluation.arviz import (
    KHAT_BAD,
    KHAT_GOOD,
    importance_resample,
    khat_verdict,
    psis_khat,
    to_inference_data,
    weighted_moments,
)

N_DRAWS = 4000


@pytest.fixture(scope="module")
def fitted():
    return fit_guide()


@pytest.fixture(scope="module")
def draws(fitted):
    guide, params = fitted
    return guide.sample_posterior_with_log_weights(
        jax.random.PRNGKey(2), params, Y, sample_shape=(N_DRAWS,)
    )


def synthetic(values, log_weights):
    """A WeightedDraws with one site 'a', without a guide."""
    return WeightedDraws({"a": np.asarray(values)}, np.asarray(log_weights), None, None)


# ------------------------------------------------------------------ InferenceData


def test_inference_data_groups_names_and_shapes(fitted):
    guide, params = fitted
    idata = to_inference_data(
        guide, jax.random.PRNGKey(3), params, Y, num_samples=N_DRAWS // 4, num_chains=4
    )
    assert {"posterior", "sample_stats", "observed_data"} <= set(idata.groups())
    post = idata.posterior
    assert set(post.data_vars) == {"mu", "tau", "shift"}
    assert post["mu"].shape == (4, N_DRAWS // 4, 2)
    assert post["tau"].shape == (4, N_DRAWS // 4)
    assert post["shift"].shape == (4, N_DRAWS // 4, 2)
    assert post["mu"].dims[:2] == ("chain", "draw")
    # constrained values: tau is positive, and the deterministic site is recomputed
    assert np.all(post["tau"].values > 0)
    np.testing.assert_allclose(
        post["shift"].values, post["mu"].values + post["tau"].values[..., None], rtol=1e-5
    )
    log_weight = idata.sample_stats["log_weight"]
    assert log_weight.dims == ("chain", "draw")
    assert log_weight.shape == (4, N_DRAWS // 4)
    assert np.all(np.isfinite(log_weight.values))
    np.testing.assert_array_equal(idata.observed_data["y"].values, np.asarray(Y))

    summary = az.summary(idata)
    assert set(summary.index) == {"mu[0]", "mu[1]", "tau", "shift[0]", "shift[1]"}
    # independent draws split into chains: R-hat ≈ 1, ESS of the order of the draws
    assert np.all(summary["r_hat"] < 1.01)
    assert np.all(summary["ess_bulk"] > 0.5 * N_DRAWS)


def test_inference_data_from_given_draws(fitted, draws):
    guide, params = fitted
    idata = to_inference_data(guide, None, params, Y, num_chains=2, draws=draws)
    assert idata.posterior["mu"].shape == (2, N_DRAWS // 2, 2)
    np.testing.assert_array_equal(
        idata.posterior["mu"].values.reshape(N_DRAWS, 2), np.asarray(draws.samples["mu"])
    )
    np.testing.assert_array_equal(
        idata.sample_stats["log_weight"].values.ravel(), np.asarray(draws.log_weights)
    )
    with pytest.raises(ValueError, match="num_chains=3"):
        to_inference_data(guide, None, params, Y, num_chains=3, draws=draws)
    with pytest.raises(ValueError, match="num_chains"):
        to_inference_data(guide, None, params, Y, num_chains=0, draws=draws)


def test_model_without_observed_sites_has_no_observed_group():
    def prior_only():
        numpyro.sample("x", dist.Normal(0.0, 1.0))

    draws = WeightedDraws({"x": np.zeros(12)}, np.zeros(12), None, None)

    class Stub:  # only .model is needed when draws are given
        model = staticmethod(prior_only)

    idata = to_inference_data(Stub(), None, None, num_chains=3, draws=draws)
    assert "observed_data" not in idata.groups()
    assert idata.posterior["x"].shape == (3, 4)


# --------------------------------------------------------------------------- PSIS


def test_khat_of_pareto_weights_matches_the_tail_index():
    """Weights 1 + Lomax(α) have a generalized Pareto tail with k = 1/α exactly; lognormal
    weights have all moments finite (k = 0)."""
    rng = np.random.default_rng(0)
    n = 20_000
    k_light = psis_khat(np.log1p(rng.pareto(1 / 0.3, size=n)))
    k_heavy = psis_khat(np.log1p(rng.pareto(1 / 1.0, size=n)))
    k_lognormal = psis_khat(rng.normal(0.0, 0.1, size=n))
    # PSIS fits M = 3 sqrt(n) ≈ 424 tail draws; sd(k̂) ≈ (1 + k) / sqrt(M) ≤ 0.1, so the
    # tolerance is 3 sds at k = 1 (more at k = 0.3)
    assert abs(k_light - 0.3) < 0.3
    assert abs(k_heavy - 1.0) < 0.3
    assert abs(k_lognormal) < 0.3
    assert khat_verdict(k_lognormal) == "good"
    assert khat_verdict(k_heavy) == "bad"
    assert k_lognormal < k_light < k_heavy


def test_khat_is_lower_for_the_trained_guide_than_for_a_poor_one(fitted, draws):
    guide, params = fitted
    # a deliberately poor proposal: q shifted by 2 of its own sds and made half as wide,
    # so exp(log w) has a heavy right tail
    poor = dict(params)
    poor["auto_loc"] = params["auto_loc"] + 2 * params["auto_scale"]
    poor["auto_scale"] = 0.5 * params["auto_scale"]
    poor_draws = guide.sample_posterior_with_log_weights(
        jax.random.PRNGKey(2), poor, Y, sample_shape=(N_DRAWS,)
    )
    k_good = psis_khat(draws.log_weights)
    k_poor = psis_khat(poor_draws.log_weights)
    assert math.isfinite(k_good) and math.isfinite(k_poor)
    assert k_good < KHAT_GOOD
    assert k_poor > KHAT_BAD
    assert khat_verdict(k_good) == "good" and khat_verdict(k_poor) == "bad"


def test_khat_verdict_thresholds():
    assert (KHAT_GOOD, KHAT_BAD) == (0.5, 0.7)
    assert khat_verdict(-0.2) == "good"
    assert khat_verdict(0.499) == "good"
    assert khat_verdict(0.5) == "ok"
    assert khat_verdict(0.699) == "ok"
    assert khat_verdict(0.7) == "bad"
    assert khat_verdict(math.inf) == "bad"
    with pytest.raises(ValueError):
        khat_verdict(math.nan)
    with pytest.raises(ValueError):
        khat_verdict("0.3")


def test_khat_edge_cases_and_bad_weights():
    assert psis_khat(np.zeros(100)) == -math.inf  # equal weights: no tail at all
    assert psis_khat(np.random.default_rng(0).normal(size=10)) == math.inf  # tail too short
    with pytest.raises(FloatingPointError, match="2 of 5"):
        psis_khat(np.array([0.0, np.nan, 1.0, np.inf, 2.0]))
    with pytest.raises(ValueError, match="empty"):
        psis_khat(np.array([]))


# ------------------------------------------------------------- weighted moments


def test_weighted_moments_recover_the_exact_posterior(draws):
    mean, sd, _ = exact_moments()
    exact = {"mu": (mean[:2], sd[:2]), "tau": (mean[2], sd[2])}
    log_w = np.asarray(draws.log_weights, np.float64)
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    for smooth in (False, True):
        moments = weighted_moments(draws, smooth=smooth)
        assert set(moments) == {"mu", "tau", "shift"}
        for site in ("mu", "tau"):
            x = np.asarray(draws.samples[site], np.float64)
            mean, std = moments[site]
            assert mean.shape == x.shape[1:] and std.shape == x.shape[1:]
            # delta-method standard error of a self-normalized IS mean
            wb = w.reshape((-1,) + (1,) * (x.ndim - 1))
            se = np.sqrt(np.sum(wb**2 * (x - mean) ** 2, axis=0))
            exact_mean, exact_sd = exact[site]
            np.testing.assert_array_less(np.abs(mean - exact_mean), 4 * se)
            # sd: delta method on the weighted variance, se(sd) = se(var) / (2 sd)
            sq = (x - mean) ** 2
            se_sd = np.sqrt(np.sum(wb**2 * (sq - std**2) ** 2, axis=0)) / (2 * std)
            np.testing.assert_array_less(np.abs(std - exact_sd), 4 * se_sd)


def test_weighted_moments_use_the_weights():
    # weights 1 : 3 on values 0 and 4: mean 3, variance 1/4·9 + 3/4·1 = 3
    d = synthetic([0.0, 4.0], np.log([1.0, 3.0]) + 1000.0)  # large shift: no overflow
    mean, std = weighted_moments(d)["a"]
    assert mean == pytest.approx(3.0)
    assert std == pytest.approx(math.sqrt(3.0))
    # a zero weight (log w = -inf) removes a draw
    mean, _ = weighted_moments(synthetic([0.0, 4.0, 100.0], [0.0, 0.0, -np.inf]))["a"]
    assert mean == pytest.approx(2.0)


def test_weighted_moments_reject_bad_input():
    with pytest.raises(FloatingPointError, match="1 of 3"):
        weighted_moments(synthetic([0.0, 1.0, 2.0], [0.0, np.nan, 0.0]))
    with pytest.raises(FloatingPointError, match="all 2"):
        weighted_moments(synthetic([0.0, 1.0], [-np.inf, -np.inf]))
    with pytest.raises(ValueError, match="'a'"):
        weighted_moments(synthetic([0.0, 1.0, 2.0], [0.0, 0.0]))
    with pytest.raises(TypeError, match="WeightedDraws"):
        weighted_moments({"a": np.zeros(3)})


# ------------------------------------------------------------------- resampling


def test_importance_resample_returns_input_draws(draws):
    out = importance_resample(jax.random.PRNGKey(4), draws, num_samples=1500)
    assert set(out) == {"mu", "tau", "shift"}
    assert out["mu"].shape == (1500, 2) and out["tau"].shape == (1500,)
    # every resampled draw is a copy of one input draw (tau's values are all distinct,
    # so they identify the draw), with all its sites taken from that same draw
    tau = np.asarray(draws.samples["tau"])
    assert np.unique(tau).size == N_DRAWS
    order = np.argsort(tau)
    index = order[np.clip(np.searchsorted(tau, out["tau"], sorter=order), 0, N_DRAWS - 1)]
    np.testing.assert_array_equal(tau[index], out["tau"])
    np.testing.assert_array_equal(np.asarray(draws.samples["mu"])[index], out["mu"])
    np.testing.assert_array_equal(np.asarray(draws.samples["shift"])[index], out["shift"])
    assert importance_resample(jax.random.PRNGKey(4), draws)["mu"].shape == (N_DRAWS, 2)


def test_importance_resample_follows_the_weights():
    # weights 0.2 / 0.8 / 0 on three values: frequencies within 4 binomial SEs
    n = 20_000
    d = synthetic([10.0, 20.0, 30.0], [math.log(0.2), math.log(0.8), -np.inf])
    out = importance_resample(jax.random.PRNGKey(0), d, num_samples=n)["a"]
    assert set(np.unique(out)) <= {10.0, 20.0}
    freq = np.mean(out == 10.0)
    assert abs(freq - 0.2) < 4 * math.sqrt(0.2 * 0.8 / n)
    with pytest.raises(ValueError, match="num_samples"):
        importance_resample(jax.random.PRNGKey(0), d, num_samples=0)
