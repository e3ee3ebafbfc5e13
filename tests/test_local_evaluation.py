"""The evaluation layer on a UHALocalGuide: ArviZ export and the comparison with NUTS
take its draws as they are (they have no joint importance weights), for the whole data.

One guide, non-centered (so the draws' site ``z`` is not the ``z_decentered`` the guide
runs), fitted briefly on minibatches: what is checked is what is exported, not the fit.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO

from numpyro_uha import UHALocalGuide
from numpyro_uha.evaluation import compare_with_nuts, hais, to_inference_data

Y = jnp.asarray(np.random.default_rng(0).normal(1.0, 1.5, 12), jnp.float32)
NOISE = 0.7


def hierarchy(y, batch=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfNormal(2.0))
    with numpyro.plate("groups", y.shape[0], subsample_size=batch) as idx:
        z = numpyro.sample("z", dist.Normal(mu, tau))
        numpyro.deterministic("shrinkage", (z - y[idx]) / tau)
        numpyro.sample("y", dist.Normal(z, NOISE), obs=y[idx])


@pytest.fixture(scope="module")
def fitted():
    guide = UHALocalGuide(hierarchy, K=2, decenter=True)
    svi = SVI(hierarchy, guide, optax.adam(1e-2), Trace_ELBO())
    params = svi.run(jax.random.PRNGKey(0), 200, Y, 4, progress_bar=False).params
    assert guide.decentered_sites == ("z",)
    return guide, params


def test_inference_data_holds_the_draws_and_the_models_log_likelihood(fitted):
    guide, params = fitted
    idata = to_inference_data(
        guide, jax.random.PRNGKey(1), params, Y, num_samples=50, num_chains=2,
        posterior_predictive=True,
    )
    assert set(idata.groups()) == {
        "posterior", "log_likelihood", "observed_data", "posterior_predictive"
    }
    post = idata.posterior
    assert set(post.data_vars) == {"mu", "tau", "z", "shrinkage"}
    assert post["z"].shape == (2, 50, Y.shape[0]) and np.all(post["tau"].values > 0)
    # the model's deterministic site, computed from each draw
    np.testing.assert_allclose(
        post["shrinkage"].values,
        (post["z"].values - np.asarray(Y)) / post["tau"].values[..., None], rtol=1e-4,
        atol=1e-5,
    )
    # the draws themselves: those of sample_posterior with the same key
    draws = guide.sample_posterior(
        jax.random.split(jax.random.PRNGKey(1))[0], params, Y, sample_shape=(100,)
    )
    np.testing.assert_allclose(post["z"].values.reshape(100, -1), draws["z"], rtol=1e-6)
    # no weights to record or judge
    assert idata.attrs["weighting"] == "none"
    assert "pareto_khat" not in idata.attrs and "importance_ess" not in idata.attrs
    # log p(y_i | z_i) of the model as written, at each exported draw
    expected = dist.Normal(post["z"].values, NOISE).log_prob(np.asarray(Y))
    np.testing.assert_allclose(idata.log_likelihood["y"].values, expected, rtol=1e-5, atol=1e-5)
    # replicates: y_i ~ N(z_i, NOISE) at each draw
    resid = (idata.posterior_predictive["y"].values - post["z"].values).ravel()
    assert abs(resid.std() - NOISE) < 4 * NOISE / math.sqrt(2 * resid.size)


def test_compare_with_nuts_reads_every_latent_under_the_models_names(fitted):
    guide, params = fitted
    reference = guide.sample_posterior(jax.random.PRNGKey(7), params, Y, sample_shape=(400,))
    comparison = compare_with_nuts(
        guide, jax.random.PRNGKey(2), params, Y, mcmc_samples=dict(reference), num_draws=400
    )
    assert set(comparison.summary.index) == {"mu", "tau", "z"}
    assert comparison.summary.loc["z", "num_elements"] == Y.shape[0]
    # two sets of the guide's own draws: their means differ by Monte Carlo error only
    # (a difference of two means of 400 draws: sd √(2/400) of the site's sd)
    assert comparison.summary["max_abs_mean_error_in_sd"].max() < 4 * math.sqrt(2 / 400)


def test_weights_and_a_minibatch_are_refused_by_name(fitted):
    guide, params = fitted
    with pytest.raises(ValueError, match="no joint importance weights"):
        to_inference_data(guide, jax.random.PRNGKey(1), params, Y, num_samples=4, resample=True)
    with pytest.raises(ValueError, match="no joint importance weights"):
        compare_with_nuts(
            guide, jax.random.PRNGKey(1), params, Y, weighted=True, mcmc_samples={}
        )
    with pytest.raises(ValueError, match="subsamples 4 of 12 data points"):
        to_inference_data(guide, jax.random.PRNGKey(1), params, Y, 4, num_samples=4)
    # the whole-model estimators say what a local guide offers instead
    with pytest.raises(TypeError, match="its own log_z and log_weights"):
        hais(guide, jax.random.PRNGKey(1), params, Y, num_draws=4)
