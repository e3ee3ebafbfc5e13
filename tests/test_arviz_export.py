"""ArviZ export and importance-weight diagnostics (numpyro_uha.evaluation.arviz).

The guide-based tests share one UHAGuide (K=4) fitted once to the model with a known
posterior of ``conjugate_model.py``. Every
guide draw uses the same number of draws (N_DRAWS), so the draw function compiles once.
Tolerances are a few Monte Carlo standard errors computed from the draws themselves.
"""

import math

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from scipy.special import logsumexp

from conjugate_model import N_OBS, NOISE_SD, Y, exact_draws, exact_moments, fit_guide
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
from numpyro_uha.guide import _marginal_std

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
    assert set(idata.groups()) == {
        "posterior", "log_likelihood", "sample_stats", "observed_data"
    }
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
    # one log-likelihood value per draw and data point (the plate); event dims summed
    assert set(idata.log_likelihood.data_vars) == {"y"}
    assert idata.log_likelihood["y"].shape == (4, N_DRAWS // 4, Y.shape[0])
    # resampled by default: sample_stats says which UHA draw each draw copies
    assert set(idata.sample_stats.data_vars) == {"uha_draw"}
    index = idata.sample_stats["uha_draw"].values
    assert index.shape == (4, N_DRAWS // 4) and index.min() >= 0 and index.max() < N_DRAWS
    assert np.unique(index).size < N_DRAWS  # resampling with replacement repeats draws
    assert idata.attrs["weighting"] == "importance_resampled"
    assert idata.attrs["num_uha_draws"] == N_DRAWS and idata.attrs["num_transitions"] == 4
    assert idata.attrs["pareto_khat"] < KHAT_GOOD
    assert 0 < idata.attrs["importance_ess"] <= N_DRAWS
    np.testing.assert_array_equal(idata.observed_data["y"].values, np.asarray(Y))

    summary = az.summary(idata)
    assert set(summary.index) == {"mu[0]", "mu[1]", "tau", "shift[0]", "shift[1]"}
    # independent draws split into chains: R-hat ≈ 1, ESS of the order of the draws
    assert np.all(summary["r_hat"] < 1.01)
    assert np.all(summary["ess_bulk"] > 0.5 * N_DRAWS)


def test_unresampled_draws_keep_their_weights(fitted):
    """resample=False on a guide's own draws: the draws as they are, with their log
    weights and the weights' diagnostics (as with given draws)."""
    guide, params = fitted
    idata = to_inference_data(
        guide, jax.random.PRNGKey(3), params, Y, num_samples=N_DRAWS // 4, num_chains=4,
        resample=False,
    )
    assert set(idata.sample_stats.data_vars) == {"log_weight"}
    assert idata.attrs["weighting"] == "none"
    log_w = idata.sample_stats["log_weight"].values.ravel()
    assert np.std(log_w) > 0  # UHA's weights, not a stand-in
    assert idata.attrs["pareto_khat"] == pytest.approx(psis_khat(log_w))
    assert 1 < idata.attrs["importance_ess"] <= N_DRAWS


def test_inference_data_from_given_draws(fitted, draws):
    guide, params = fitted
    idata = to_inference_data(guide, None, params, Y, num_chains=2, draws=draws, resample=False)
    assert idata.posterior["mu"].shape == (2, N_DRAWS // 2, 2)
    np.testing.assert_array_equal(
        idata.posterior["mu"].values.reshape(N_DRAWS, 2), np.asarray(draws.samples["mu"])
    )
    assert set(idata.sample_stats.data_vars) == {"log_weight"}
    np.testing.assert_array_equal(
        idata.sample_stats["log_weight"].values.ravel(), np.asarray(draws.log_weights)
    )
    assert idata.attrs["weighting"] == "none"
    assert idata.attrs["pareto_khat"] == pytest.approx(psis_khat(draws.log_weights))
    w = np.exp(np.asarray(draws.log_weights, np.float64) - np.max(draws.log_weights))
    assert idata.attrs["importance_ess"] == pytest.approx(w.sum() ** 2 / np.sum(w**2))
    with pytest.raises(ValueError, match="num_chains=3"):
        to_inference_data(guide, None, params, Y, num_chains=3, draws=draws)
    with pytest.raises(ValueError, match="num_chains"):
        to_inference_data(guide, None, params, Y, num_chains=0, draws=draws)


def test_resampled_posterior_is_importance_resample_of_the_draws(fitted, draws):
    guide, params = fitted
    key = jax.random.PRNGKey(6)
    idata = to_inference_data(guide, key, params, Y, num_chains=2, draws=draws)
    expected = importance_resample(key, draws)
    for name in ("mu", "tau", "shift"):
        np.testing.assert_array_equal(
            idata.posterior[name].values.reshape(expected[name].shape), expected[name]
        )
    index = idata.sample_stats["uha_draw"].values.ravel()
    np.testing.assert_array_equal(np.asarray(draws.samples["tau"])[index], expected["tau"])
    # rng_key=None with given draws resamples with PRNGKey(0), reproducibly
    default = to_inference_data(guide, None, params, Y, num_chains=2, draws=draws)
    np.testing.assert_array_equal(
        default.posterior["tau"].values.ravel(),
        importance_resample(jax.random.PRNGKey(0), draws)["tau"],
    )
    without = to_inference_data(guide, key, params, Y, draws=draws, log_likelihood=False)
    assert "log_likelihood" not in without.groups()
    assert "observed_data" in without.groups()


def test_model_without_observed_sites_has_no_observed_group():
    def prior_only():
        numpyro.sample("x", dist.Normal(0.0, 1.0))

    draws = WeightedDraws({"x": np.zeros(12)}, np.zeros(12), None, None)

    class Stub:  # only .model is needed when draws are given
        model = staticmethod(prior_only)

    idata = to_inference_data(Stub(), None, None, num_chains=3, draws=draws)
    assert "observed_data" not in idata.groups()
    assert idata.posterior["x"].shape == (3, 4)


def test_posterior_predictive_replicates_follow_the_exact_predictive(fitted):
    """Each data point's replicates, over the draws, have the exact posterior
    predictive's mean and variance, N(mu_n, NOISE_SD² + var_n) per coordinate (returning
    the observations instead would give each point a variance of 0), and ArviZ's
    posterior predictive check plots them."""
    guide, params = fitted
    idata = to_inference_data(
        guide, jax.random.PRNGKey(3), params, Y, num_samples=N_DRAWS // 4, num_chains=4,
        posterior_predictive=True,
    )
    assert set(idata.posterior_predictive.data_vars) == {"y"}
    rep = np.asarray(idata.posterior_predictive["y"], np.float64)
    assert rep.shape == (4, N_DRAWS // 4, N_OBS, 2)
    rep = rep.reshape(N_DRAWS, N_OBS, 2)
    mean, sd, _ = exact_moments()
    var_n = sd[0] ** 2
    # resampled draws repeat: mu's share of the error counts the weights' ESS only
    ess = idata.attrs["importance_ess"]
    se_mean = np.sqrt(NOISE_SD**2 / N_DRAWS + var_n / ess)
    total = NOISE_SD**2 + var_n
    se_var = total * np.sqrt(2.0 / N_DRAWS) + var_n * np.sqrt(2.0 / ess)
    assert np.all(np.abs(rep.mean(0) - mean[:2]) < 4 * se_mean), rep.mean(0)
    assert np.all(np.abs(rep.var(0) - total) < 4 * se_var), rep.var(0)
    import matplotlib

    matplotlib.use("Agg")
    az.plot_ppc(idata, num_pp_samples=50)


class _GivenDraws:
    """A guide stand-in for ``to_inference_data(..., draws=...)``: only ``.model`` is
    read when the draws are given."""

    def __init__(self, model):
        self.model = model


def test_posterior_predictive_simulates_the_model_jointly():
    """y2's location is y1's value: its replicate must follow y1's replicate (variance
    var(mu) + 2), not the observed y1 (variance 1); a factor has no replicate."""

    def chain(y1, y2):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        first = numpyro.sample("y1", dist.Normal(mu, 1.0), obs=y1)
        numpyro.sample("y2", dist.Normal(first, 1.0), obs=y2)
        numpyro.factor("penalty", -0.0 * mu)

    n = 4000
    mu = 0.2 + math.sqrt(0.5) * np.random.default_rng(0).standard_normal(n)
    draws = WeightedDraws({"mu": mu}, np.zeros(n), None, None)
    idata = to_inference_data(
        _GivenDraws(chain), jax.random.PRNGKey(0), None, 0.4, 3.0, draws=draws,
        resample=False, posterior_predictive=True,
    )
    rep = idata.posterior_predictive
    assert set(rep.data_vars) == {"y1", "y2"}
    var_mu = np.var(mu)
    for name, expected in (("y1", var_mu + 1.0), ("y2", var_mu + 2.0)):
        values = np.asarray(rep[name], np.float64).ravel()
        assert abs(np.var(values) - expected) < 4 * expected * math.sqrt(2.0 / n), name
    # the replicates are drawn at the given draws: y1's mean follows mu's
    assert np.corrcoef(np.asarray(rep["y1"]).ravel(), mu)[0, 1] > 0.4


def test_posterior_predictive_needs_an_observed_site_and_a_bool():
    def factor_only():
        x = numpyro.sample("x", dist.Normal(0.0, 1.0))
        numpyro.factor("f", -(x**2))

    draws = WeightedDraws({"x": np.zeros(4)}, np.zeros(4), None, None)
    with pytest.raises(ValueError, match="no observed sites to replicate"):
        to_inference_data(_GivenDraws(factor_only), None, None, draws=draws,
                          posterior_predictive=True)
    with pytest.raises(TypeError, match="posterior_predictive must be True or False"):
        to_inference_data(_GivenDraws(factor_only), None, None, draws=draws,
                          posterior_predictive="yes")


# ------------------------------------------------------------- log-likelihood, LOO


def model_log_likelihood(mu):
    """log p(y_j | mu) of every draw (leading dims of ``mu``) and observation j, computed
    directly from the conjugate model's likelihood: N(mu, NOISE_SD) on each 2-vector."""
    mu = jnp.asarray(mu)[..., None, :]
    return np.asarray(dist.Normal(mu, NOISE_SD).log_prob(Y).sum(-1), np.float64)


@pytest.mark.parametrize("resample", [True, False], ids=["resampled", "raw"])
def test_log_likelihood_is_the_models_density_of_the_observations(fitted, draws, resample):
    guide, params = fitted
    idata = to_inference_data(
        guide, jax.random.PRNGKey(5), params, Y, num_chains=4, draws=draws, resample=resample
    )
    log_lik = idata.log_likelihood["y"].values
    assert log_lik.shape == (4, N_DRAWS // 4, Y.shape[0])
    # at each stored draw: the group's values belong to the posterior draw in the same place
    np.testing.assert_allclose(
        log_lik, model_log_likelihood(idata.posterior["mu"].values), rtol=1e-5, atol=1e-4
    )


def test_log_likelihood_of_every_observed_site_with_the_models_params():
    """A model with its own numpyro.param, two observed sites (one in a plate) and a
    deterministic site; draws given, no guide needed. The log-likelihood is computed in
    chunks of the guide's sample_batch_size (5 here: 5 + 5 + 2 draws)."""
    x = jnp.array([0.3, -1.0, 2.0])
    pair = jnp.array([0.5, -0.5])

    def two_sites(x):
        sd = numpyro.param("sd", 1.0, constraint=dist.constraints.positive)
        a = numpyro.sample("a", dist.Normal(0.0, 1.0))
        numpyro.deterministic("twice", 2 * a)
        with numpyro.plate("n", x.shape[0]):
            numpyro.sample("y1", dist.Normal(a, sd), obs=x)
        numpyro.sample("y2", dist.Normal(a, 1.0).expand([2]).to_event(1), obs=pair)

    class Stub:  # the guide's model and batch size are all that is needed with draws
        model = staticmethod(two_sites)
        sample_batch_size = 5

    a = np.linspace(-1.0, 1.0, 12)
    log_w = np.log(np.linspace(0.1, 1.0, 12))
    draws = WeightedDraws({"a": a, "twice": 2 * a}, log_w, None, None)
    for resample in (False, True):
        idata = to_inference_data(
            Stub(), jax.random.PRNGKey(0), {"sd": 2.0, "auto_loc": 0.0}, x,
            num_chains=2, draws=draws, resample=resample,
        )
        assert set(idata.log_likelihood.data_vars) == {"y1", "y2"}
        assert set(idata.observed_data.data_vars) == {"y1", "y2"}
        a_post = idata.posterior["a"].values
        assert idata.log_likelihood["y1"].shape == (2, 6, 3)
        assert idata.log_likelihood["y2"].shape == (2, 6)
        np.testing.assert_allclose(
            idata.log_likelihood["y1"].values,
            dist.Normal(a_post[..., None], 2.0).log_prob(x),  # sd from params, not 1.0
            rtol=1e-6,
        )
        np.testing.assert_allclose(
            idata.log_likelihood["y2"].values,
            dist.Normal(a_post[..., None], 1.0).log_prob(pair).sum(-1),
            rtol=1e-6,
        )


def test_large_observed_sites_are_computed_in_chunks_of_bounded_size(monkeypatch):
    """The pointwise log-likelihood and the replicated data are computed a few draws at a
    time where the guide's batch of draws would hold more than CHUNK_VALUES values of
    the observed sites (here 7 values per draw against a cap of 15: 2 draws a chunk)."""
    import numpyro_uha.evaluation.arviz as export

    x = jnp.linspace(-1.0, 1.0, 5)

    def observed_twice(x):
        a = numpyro.sample("a", dist.Normal(0.0, 1.0))
        with numpyro.plate("n", x.shape[0]):
            numpyro.sample("y1", dist.Normal(a, 1.0), obs=x)
        numpyro.sample("y2", dist.Normal(a, 1.0).expand([2]).to_event(1), obs=x[:2])

    class Stub:
        model = staticmethod(observed_twice)
        sample_batch_size = 1000

    sizes = []
    in_chunks = export._in_chunks
    monkeypatch.setattr(export, "CHUNK_VALUES", 15)
    monkeypatch.setattr(
        export, "_in_chunks", lambda fn, samples, size: sizes.append(size) or in_chunks(fn, samples, size)
    )
    a = np.linspace(-1.0, 1.0, 12)
    draws = WeightedDraws({"a": a}, np.zeros(12), None, None)
    idata = to_inference_data(
        Stub(), jax.random.PRNGKey(0), {}, x, num_chains=2, draws=draws, resample=False,
        posterior_predictive=True,
    )
    assert sizes == [2, 2]
    a_post = idata.posterior["a"].values
    np.testing.assert_allclose(
        idata.log_likelihood["y1"].values, dist.Normal(a_post[..., None], 1.0).log_prob(x),
        rtol=1e-6,
    )
    replicated = idata.posterior_predictive["y1"].values
    assert replicated.shape == (2, 6, 5)


def loo_mc_se_exact(log_lik):
    """Monte Carlo standard error of elpd_loo from S independent posterior draws.

    elpd_loo = Σ_i -log E[a_i], a_i = 1/p(y_i | θ), estimated by Σ_i -log(mean_s a_is)
    (PSIS only smooths the largest a_is). Its delta-method (influence function) variance
    is var_s(h_s)/S with h_s = Σ_i a_is/ā_i: the sum over i keeps the correlation between
    the terms, which use the same draws. ``log_lik``: (S, n).
    """
    log_a = -log_lik
    log_a_bar = logsumexp(log_a, axis=0) - math.log(log_a.shape[0])
    h = np.exp(log_a - log_a_bar).sum(axis=1)
    return float(np.std(h, ddof=1) / math.sqrt(h.size))


def loo_mc_se_resampled(log_lik, log_weights, num_resampled):
    """Monte Carlo standard error of elpd_loo from ``num_resampled`` draws resampled from
    N weighted draws (self-normalized weights w̃).

    The same influence function with weighted means, h_s = Σ_i a_is/ā_i with
    ā_i = Σ_s w̃_s a_is, has two independent sources of error: the importance sampling,
    variance Σ_s w̃_s² (h_s - h̄)², and the multinomial resampling given the draws,
    variance Σ_s w̃_s (h_s - h̄)² / num_resampled, with h̄ = Σ_s w̃_s h_s.
    """
    log_w = np.asarray(log_weights, np.float64)
    w = np.exp(log_w - logsumexp(log_w))
    log_a = -log_lik
    log_a_bar = logsumexp(log_a, axis=0, b=w[:, None])
    h = np.exp(log_a - log_a_bar).sum(axis=1)
    h_bar = np.sum(w * h)
    var_is = np.sum(w**2 * (h - h_bar) ** 2)
    var_resampling = np.sum(w * (h - h_bar) ** 2) / num_resampled
    return float(np.sqrt(var_is + var_resampling))


@pytest.fixture(scope="module")
def exact_loo():
    """az.loo of exact posterior draws, and its Monte Carlo standard error."""
    mu = exact_draws(N_DRAWS, seed=5)["mu"]
    log_lik = model_log_likelihood(mu)
    idata = az.from_dict(posterior={"mu": mu[None]}, log_likelihood={"y": log_lik[None]})
    return az.loo(idata), loo_mc_se_exact(log_lik)


def uha_loo(guide, params, draws, resample):
    idata = to_inference_data(
        guide, jax.random.PRNGKey(7), params, Y, num_chains=4, draws=draws, resample=resample
    )
    log_lik = model_log_likelihood(np.asarray(draws.samples["mu"]))  # at the UHA draws
    if resample:
        se = loo_mc_se_resampled(log_lik, draws.log_weights, N_DRAWS)
    else:
        se = loo_mc_se_exact(log_lik)  # unweighted: independent draws (of the wrong law)
    return az.loo(idata), se, idata


def test_loo_agrees_with_loo_of_exact_posterior_draws(fitted, draws, exact_loo):
    """az.loo's own ``se`` (≈ 4 here) is the sampling error of elpd over data sets, not
    Monte Carlo error, so it cannot tell right from wrong draws: the tolerance is 4 Monte
    Carlo standard errors of the difference (≈ 0.05 each side). Checked over seeds: the
    exact-draw formula matched the spread of 40 seeds; the resampled one came out 22%
    below the spread of 25 seeds of the poor proposal of the next test."""
    guide, params = fitted
    loo_exact, se_exact = exact_loo
    loo_uha, se_uha, idata = uha_loo(guide, params, draws, resample=True)
    assert loo_uha.n_data_points == Y.shape[0] and loo_uha.n_samples == N_DRAWS
    assert np.all(loo_uha.pareto_k.values < KHAT_GOOD)
    assert se_uha < 0.05 * loo_uha.se  # the Monte Carlo error is small next to az.loo's se
    assert abs(loo_uha.elpd_loo - loo_exact.elpd_loo) < 4 * math.hypot(se_uha, se_exact)
    assert az.waic(idata).n_data_points == Y.shape[0]  # WAIC reads the same group


def test_loo_uses_the_importance_weights(fitted, exact_loo):
    """A deliberately poor proposal (q shifted by one of its sds and 1.5 times as wide):
    its raw draws are too spread out and their LOO is off by far more than the Monte Carlo
    error; resampled by their weights (k̂ < 0.5), they agree with the exact posterior's."""
    guide, params = fitted
    scale = guide._param_name("scale")  # auto_scale, or auto_scale_tril for full rank
    poor = dict(params)
    poor["auto_loc"] = params["auto_loc"] + _marginal_std(params[scale])
    poor[scale] = 1.5 * params[scale]
    poor_draws = guide.sample_posterior_with_log_weights(
        jax.random.PRNGKey(8), poor, Y, sample_shape=(N_DRAWS,)
    )
    assert psis_khat(poor_draws.log_weights) < KHAT_GOOD
    loo_exact, se_exact = exact_loo
    resampled, se_resampled, _ = uha_loo(guide, poor, poor_draws, resample=True)
    raw, se_raw, _ = uha_loo(guide, poor, poor_draws, resample=False)
    assert abs(resampled.elpd_loo - loo_exact.elpd_loo) < 4 * math.hypot(se_resampled, se_exact)
    assert abs(raw.elpd_loo - loo_exact.elpd_loo) > 8 * math.hypot(se_raw, se_exact)


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
    scale = guide._param_name("scale")
    poor = dict(params)
    poor["auto_loc"] = params["auto_loc"] + 2 * _marginal_std(params[scale])
    poor[scale] = 0.5 * params[scale]
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
    # every resampled draw is a copy of one input draw, with all its sites taken from
    # that same draw: the values of all sites together identify a draw (one site alone
    # need not: two of 4000 float32 values can coincide)
    def rows(samples, n):
        sites = ("tau", "mu", "shift")
        return [
            np.concatenate([np.ravel(np.asarray(samples[k])[i]) for k in sites]).tobytes()
            for i in range(n)
        ]

    inputs = rows(draws.samples, N_DRAWS)
    assert len(set(inputs)) == N_DRAWS
    known = set(inputs)
    assert all(row in known for row in rows(out, 1500))
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


def test_numpyro_guides_are_refused_with_what_to_do_instead():
    """to_inference_data and compare_with_nuts draw UHA's weighted draws; NumPyro's own
    guides (which log_z takes) failed inside with an AttributeError."""
    from numpyro.infer.autoguide import AutoNormal

    from numpyro_uha.evaluation import compare_with_nuts

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    guide = AutoNormal(model)
    params = {"mu_auto_loc": jnp.zeros(()), "mu_auto_scale": jnp.ones(())}
    for call in (to_inference_data, compare_with_nuts):
        with pytest.raises(TypeError, match="takes a UHAGuide or a UHALocalGuide, got AutoNormal"):
            call(guide, jax.random.PRNGKey(0), params, jnp.ones(3))
