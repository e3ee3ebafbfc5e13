"""Diverged (non-finite) draws: sample_posterior's ``nonfinite`` modes, log Z with diverged
draws counted as zero weights, ArviZ export and the poor-fit warning (enumerated discrete
sites, which this file once checked the advice for, are supported: tests/test_enumerate.py).

A diverging draw is made deterministic with a model whose log density is NaN (in value
only; its gradient is 0) for x > c: with q = N(0, 1), the prior, the draws end in that
region with probability ≈ P(N(0, 1) > c), and c is a model argument (one compilation).
"""

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax.scipy.special import logsumexp
from numpyro.infer import SVI, Trace_ELBO

from numpyro_uha import (
    UHAFitWarning,
    UHAGuide,
    UHAImproperPosteriorWarning,
    UHANonfiniteDrawsWarning,
    WeightedDraws,
)
from numpyro_uha.evaluation import log_z, log_z_from_weights, to_inference_data
from numpyro_uha.evaluation.estimators import _forward

N = 2000
RARE = jnp.asarray(2.5)  # ~0.6 % of the draws diverge (11 of 2000 with this key)
OFTEN = jnp.asarray(1.0)  # ~15 %: more than 10 %
NEVER = jnp.asarray(100.0)
KEY = jax.random.PRNGKey(1)


def nan_region_model(c):
    x = numpyro.sample("x", dist.Normal(0.0, 1.0))
    numpyro.factor("nan_region", jnp.where(x > c, jnp.nan, 0.0))


@pytest.fixture(scope="module")
def fitted():
    """(guide, params) with q = N(0, 1), the prior: the weights are almost constant."""
    guide = UHAGuide(nan_region_model, K=4, warm_start_steps=0)
    svi = SVI(nan_region_model, guide, optax.adam(1e-3), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), NEVER))
    return guide, dict(params, auto_loc=jnp.zeros(1), auto_scale=jnp.ones(1))


@pytest.fixture(scope="module")
def kept(fitted):
    guide, params = fitted
    draws = guide.sample_posterior_with_log_weights(
        KEY, params, RARE, sample_shape=(N,), nonfinite="keep"
    )
    finite = np.isfinite(np.asarray(draws.log_weights))
    assert 0 < N - finite.sum() < 0.1 * N  # the construction gives a few diverged draws
    return draws, finite


def test_keep_returns_every_draw(kept):
    draws, finite = kept
    assert draws.log_weights.shape == (N,) and draws.num_dropped == 0
    assert np.isnan(np.asarray(draws.log_weights)[~finite]).all()


def test_drop_removes_diverged_draws_and_warns(fitted, kept):
    guide, params = fitted
    full, finite = kept
    bad = int(N - finite.sum())
    with pytest.warns(UHANonfiniteDrawsWarning) as record:
        draws = guide.sample_posterior_with_log_weights(KEY, params, RARE, sample_shape=(N,))
    message = str(record[0].message)
    assert issubclass(record[0].category, RuntimeWarning)
    assert f"{bad} of {N} draws" in message and "diverged" in message
    assert "learning rate" in message and "max_step_size" in message
    assert draws.num_dropped == bad
    assert draws.log_weights.shape == (N - bad,)
    assert draws.latent.shape == (N - bad, 1)
    assert draws.samples["x"].shape == (N - bad,)
    assert jax.tree.leaves(draws.info)[0].shape[0] == N - bad
    np.testing.assert_array_equal(draws.log_weights, np.asarray(full.log_weights)[finite])
    np.testing.assert_array_equal(draws.latent, np.asarray(full.latent)[finite])
    np.testing.assert_array_equal(draws.samples["x"], np.asarray(full.samples["x"])[finite])
    assert np.isfinite(np.asarray(draws.log_weights)).all()


def test_sample_posterior_drops_by_default(fitted, kept):
    guide, params = fitted
    _, finite = kept
    with pytest.warns(UHANonfiniteDrawsWarning, match=f"{N - finite.sum()} of {N}"):
        samples = guide.sample_posterior(KEY, params, RARE, sample_shape=(N,))
    assert samples["x"].shape == (finite.sum(),)
    assert np.isfinite(np.asarray(samples["x"])).all()


def test_raise_mode_raises_with_the_count(fitted, kept):
    guide, params = fitted
    _, finite = kept
    with pytest.raises(FloatingPointError, match=f"{N - finite.sum()} of {N} draws"):
        guide.sample_posterior(KEY, params, RARE, sample_shape=(N,), nonfinite="raise")


def test_more_than_ten_percent_raises_even_when_dropping(fitted):
    guide, params = fitted
    with pytest.raises(FloatingPointError, match="more than 10 %.*unusable"):
        guide.sample_posterior(KEY, params, OFTEN, sample_shape=(N,))


def test_scalar_sample_shape_with_a_diverged_draw_raises(fitted):
    guide, params = fitted
    with pytest.raises(FloatingPointError, match="1 of 1 draws"):
        guide.sample_posterior(KEY, params, jnp.asarray(-10.0))


def test_multidimensional_sample_shape_cannot_drop(fitted):
    guide, params = fitted
    with pytest.raises(ValueError, match=r"one-dimensional.*\(2000,\).*nonfinite='keep'"):
        guide.sample_posterior(KEY, params, RARE, sample_shape=(40, 50))
    samples = guide.sample_posterior(KEY, params, RARE, sample_shape=(40, 50), nonfinite="keep")
    assert samples["x"].shape == (40, 50)


def test_bad_nonfinite_value(fitted):
    guide, params = fitted
    for bad in ["ignore", None, "DROP"]:
        with pytest.raises(ValueError, match=r"nonfinite.*'drop', 'raise', 'keep'"):
            guide.sample_posterior(KEY, params, RARE, sample_shape=(10,), nonfinite=bad)


def test_under_jit_draws_are_kept(fitted, kept):
    guide, params = fitted
    samples = jax.jit(lambda k: guide.sample_posterior(k, params, RARE, sample_shape=(100,)))(KEY)
    assert samples["x"].shape == (100,)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UHANonfiniteDrawsWarning)
        draws = jax.jit(
            lambda k: guide.sample_posterior_with_log_weights(k, params, RARE, sample_shape=(N,))
        )(KEY)
    # nothing can be dropped from traced values: the same draws as "keep" (up to float32
    # rounding: another compilation)
    assert draws.log_weights.shape == (N,)
    np.testing.assert_array_equal(np.isfinite(draws.log_weights), kept[1])
    np.testing.assert_allclose(draws.log_weights, kept[0].log_weights, atol=1e-5)


def test_weighted_draws_is_backwards_compatible():
    draws = WeightedDraws({"a": np.zeros(3)}, np.zeros(3), None, None)
    assert draws.num_dropped == 0 and len(draws) == 5


# ----------------------------------------------------------------- evaluation


def test_log_z_from_weights_counts_diverged_draws_as_zero_weights():
    est = log_z_from_weights(np.array([0.0, np.nan, -np.inf, 0.0, 1.0]))
    assert est.num_nonfinite == 2 and est.num_draws == 5
    assert est.iw == pytest.approx(math.log((2 + math.e) / 5))
    assert est.elbo == pytest.approx(1 / 3)
    assert math.isfinite(est.elbo_se)
    assert "2 of 5 draws diverged (counted as w = 0)" in str(est)
    assert "over the 3 finite draws" in str(est)
    with pytest.raises(FloatingPointError, match="\\+inf"):
        log_z_from_weights(np.array([0.0, np.inf, 1.0]))
    with pytest.raises(FloatingPointError, match="fewer than two finite"):
        log_z_from_weights(np.array([0.0, np.nan, np.nan]))
    assert "diverged" not in str(log_z_from_weights(np.array([0.0, 1.0])))


def test_log_z_of_a_guide_with_diverged_draws(fitted):
    guide, params = fitted
    est = log_z(guide, KEY, params, RARE, num_draws=N)
    log_w, _ = _forward(
        KEY, guide.get_logdensity_fn(params, RARE), guide.get_annealing_params(params), N,
        False, guide.num_leapfrog_steps, guide.sample_batch_size, guide.integrator,
    )
    finite = np.isfinite(log_w)
    assert est.num_nonfinite == N - finite.sum() > 0
    assert est.num_draws == N
    # (float32 weights from another compilation: equal up to rounding)
    assert est.iw == pytest.approx(float(logsumexp(log_w[finite])) - math.log(N), abs=1e-5)
    assert est.elbo == pytest.approx(float(np.mean(log_w[finite])), abs=1e-5)
    assert math.isfinite(est.elbo_se) and math.isfinite(est.iw_se)
    text = str(est)
    assert f"{N - finite.sum()} of {N} draws diverged (counted as w = 0)" in text
    assert "inf" not in text


def test_to_inference_data_with_diverged_draws(fitted, kept):
    guide, params = fitted
    _, finite = kept
    bad = int(N - finite.sum())
    with pytest.warns(UHANonfiniteDrawsWarning, match=f"{bad} of {N}.*zero weight"):
        idata = to_inference_data(guide, KEY, params, RARE, draws=kept[0], num_chains=2)
    assert idata.attrs["num_nonfinite"] == bad
    assert set(np.unique(idata.sample_stats["uha_draw"].values)) <= set(np.flatnonzero(finite))
    x = idata.posterior["x"].values
    assert x.shape == (2, N // 2) and np.isfinite(x).all()
    assert math.isfinite(idata.attrs["importance_ess"])
    with pytest.warns(UHANonfiniteDrawsWarning):
        raw = to_inference_data(
            guide, KEY, params, RARE, draws=kept[0], num_chains=2, resample=False
        )
    kept_n = (N - bad) // 2 * 2
    assert raw.posterior["x"].shape == (2, kept_n // 2)
    np.testing.assert_array_equal(
        raw.posterior["x"].values.ravel(), np.asarray(kept[0].samples["x"])[finite][:kept_n]
    )
    with pytest.raises(FloatingPointError, match="more than 10 %"):
        to_inference_data(guide, KEY, params, OFTEN, num_samples=N)


# ------------------------------------------------------------ poor-fit warning


def test_no_fit_warning_on_a_good_fit(fitted):
    guide, params = fitted
    with warnings.catch_warnings():
        warnings.simplefilter("error", UHAFitWarning)
        log_z(guide, KEY, params, NEVER, num_draws=N)
        to_inference_data(guide, KEY, params, NEVER, num_samples=N, log_likelihood=False)


def test_fit_warning_on_a_poor_fit(fitted):
    guide, params = fitted
    # q 5 sds out in the prior's tail and too narrow: heavy-tailed weights (k̂ ≈ 0.9-1.7)
    poor = dict(params, auto_loc=jnp.full(1, 5.0), auto_scale=jnp.full(1, 0.5))
    with pytest.warns(UHAFitWarning, match=r"Pareto k̂ = \d\.\d\d ≥ 0.7.*Train longer.*larger K"):
        log_z(guide, KEY, poor, NEVER, num_draws=N)
    with pytest.warns(UHAFitWarning, match="k̂"):
        to_inference_data(guide, KEY, poor, NEVER, num_samples=N, log_likelihood=False)


def test_a_draw_whose_constrained_value_overflows_is_not_finite():
    """z finite but too far out for the site's transform (exp(100) overflows float32): the
    log weight is finite (an improper flat prior on a positive site, as an improper
    posterior's widening q reaches), the value is inf. Such draws were returned as
    finite (the mean of another site 8e16 in a fit); they now count as failed draws."""
    from numpyro.distributions import constraints

    def model():
        numpyro.sample("mu", dist.Normal(0.0, 1.0))
        numpyro.sample("s", dist.ImproperUniform(constraints.positive, (), ()))

    guide = UHAGuide(model, K=2, warm_start_steps=0)
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    with pytest.warns(UHAImproperPosteriorWarning, match="'s'"):  # named at setup too
        params = svi.get_params(svi.init(jax.random.PRNGKey(0)))
    far = dict(params, auto_loc=jnp.full_like(params["auto_loc"], 100.0))
    draws = guide.sample_posterior_with_log_weights(KEY, far, sample_shape=(50,), nonfinite="keep")
    assert np.all(np.isfinite(np.asarray(draws.log_weights)))
    assert np.all(np.isinf(np.asarray(draws.samples["s"])))
    with pytest.raises(FloatingPointError, match="50 of 50 draws have a non-finite"):
        guide.sample_posterior(KEY, far, sample_shape=(50,))
    # at q's start the same draws are finite and returned
    assert np.all(np.isfinite(np.asarray(guide.sample_posterior(KEY, params, sample_shape=(50,))["s"])))
