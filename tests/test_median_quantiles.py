"""``UHAGuide.median`` and ``quantiles`` return what AutoNormal's return: every latent and
every deterministic site.

The guide is only set up (svi.init), not trained: these are properties of the Monte Carlo
summaries, true for any parameters. With an odd number of draws the sample median is one
of the draws, so for a deterministic site that is an increasing function of one latent
site, its median is exactly that function of the latent's median.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from numpyro_uha import UHAGuide

Y = jnp.array([0.8, 1.9, 1.1, 0.4, 1.5])
NUM_SAMPLES = 1001


def model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
    sigma = numpyro.sample("sigma", dist.LogNormal(0.0, 0.5))
    numpyro.deterministic("exp_mu", jnp.exp(mu))
    numpyro.deterministic("pair", jnp.stack([mu, 2.0 * sigma]))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


def set_up(guide):
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    return svi.get_params(svi.init(jax.random.PRNGKey(0), Y))


@pytest.fixture(scope="module")
def guides():
    uha = UHAGuide(model, K=2, warm_start_steps=50)
    normal = AutoNormal(model)
    return (uha, set_up(uha)), (normal, set_up(normal))


def test_median_has_the_sites_and_shapes_of_auto_normal(guides):
    (uha, params), (normal, normal_params) = guides
    median = uha.median(params, Y, num_samples=NUM_SAMPLES)
    expected = normal.median(normal_params)
    assert set(expected) == {"mu", "sigma", "exp_mu", "pair"}
    assert set(median) == set(expected)
    for name in expected:
        assert jnp.shape(median[name]) == jnp.shape(expected[name]), name
    # the deterministic sites are medians of the sites' own draws
    draws = uha.sample_posterior(jax.random.PRNGKey(0), params, Y, sample_shape=(NUM_SAMPLES,))
    for name in ("exp_mu", "pair"):
        np.testing.assert_array_equal(median[name], jnp.median(draws[name], axis=0))
    np.testing.assert_allclose(median["exp_mu"], jnp.exp(median["mu"]), rtol=1e-5)
    np.testing.assert_allclose(median["pair"], [median["mu"], 2 * median["sigma"]], rtol=1e-5)


def test_quantiles_have_the_sites_and_shapes_of_auto_normal(guides):
    (uha, params), (normal, normal_params) = guides
    levels = [0.1, 0.5, 0.9]
    quantiles = uha.quantiles(params, levels, Y, num_samples=NUM_SAMPLES)
    expected = normal.quantiles(normal_params, levels)
    assert set(quantiles) == set(expected) == {"mu", "sigma", "exp_mu", "pair"}
    for name in expected:
        assert jnp.shape(quantiles[name]) == jnp.shape(expected[name]), name
    # quantiles at (NUM_SAMPLES - 1) · level are order statistics, so an increasing
    # function of one latent commutes with them
    np.testing.assert_allclose(quantiles["exp_mu"], jnp.exp(quantiles["mu"]), rtol=1e-4)
    np.testing.assert_allclose(quantiles["pair"][:, 1], 2 * quantiles["sigma"], rtol=1e-4)
    assert bool(jnp.all(jnp.diff(quantiles["exp_mu"]) > 0))
    # the median and the 0.5 quantile agree
    median = uha.median(params, Y, num_samples=NUM_SAMPLES)
    np.testing.assert_allclose(quantiles["exp_mu"][1], median["exp_mu"], rtol=1e-6)


def test_draws_without_arguments_use_the_first_calls_data(guides):
    """``sample_posterior(key, params, sample_shape=...)``, as AutoNormal's is usually
    called, draws with the data of the guide's setup: the same draws as with them."""
    uha, params = guides[0]
    key = jax.random.PRNGKey(3)
    without = uha.sample_posterior(key, params, sample_shape=(50,))
    given = uha.sample_posterior(key, params, Y, sample_shape=(50,))
    for name in given:
        np.testing.assert_array_equal(without[name], given[name])
    weighted = uha.sample_posterior_with_log_weights(key, params, sample_shape=(50,))
    np.testing.assert_array_equal(
        weighted.log_weights, uha.sample_posterior_with_log_weights(key, params, Y, sample_shape=(50,)).log_weights
    )
    # other data given explicitly are used, not the setup's
    other = uha.sample_posterior(key, params, Y + 3.0, sample_shape=(50,))
    assert not np.array_equal(other["mu"], given["mu"])


@pytest.mark.parametrize("method", ["get_posterior", "get_transform", "get_base_dist"])
def test_closed_form_posterior_methods_say_what_to_use_instead(guides, method):
    uha, params = guides[0]
    args = () if method == "get_base_dist" else (params,)
    with pytest.raises(NotImplementedError, match="no closed form.*sample_posterior"):
        getattr(uha, method)(*args)


def _counting_model(y):
    w = numpyro.sample("w", dist.Normal(jnp.zeros(3), 1.0).to_event(1))
    numpyro.deterministic("best", jnp.argmax(w))  # an index: int32
    numpyro.deterministic("positive", w[0] > 0)  # a flag: bool
    numpyro.sample("y", dist.Normal(w.sum(), 1.0), obs=y)


def test_integer_and_boolean_sites_keep_their_dtype_and_take_a_draws_value():
    # (before, their median and quantiles came back as float32, a median of 0.5 possible)
    y = jnp.asarray(0.3)
    guide = UHAGuide(_counting_model, K=2, warm_start_steps=0)
    svi = SVI(_counting_model, guide, optax.adam(1e-2), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), y))
    draws = guide.sample_posterior(jax.random.PRNGKey(0), params, y, sample_shape=(1000,))
    median = guide.median(params, y)
    quantiles = guide.quantiles(params, [0.1, 0.9], y)
    for name, dtype in (("best", jnp.int32), ("positive", jnp.bool_)):
        assert draws[name].dtype == dtype
        assert median[name].dtype == dtype and quantiles[name].dtype == dtype
        values = np.asarray(draws[name]).astype(int)
        assert int(median[name]) == np.quantile(values, 0.5, method="lower")
        np.testing.assert_array_equal(
            np.asarray(quantiles[name]).astype(int), np.quantile(values, [0.1, 0.9], method="lower")
        )
    np.testing.assert_allclose(median["w"], np.median(np.asarray(draws["w"]), axis=0), rtol=1e-6)
