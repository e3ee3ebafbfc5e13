"""A keyword that is neither the called function's option nor the model's is named at
the call (it used to reach the model and fail there with the model's own TypeError),
with the option probably meant: the package's functions say ``num_draws``,
``num_samples`` or ``sample_shape`` for the number of draws, as NumPyro's do."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO

from numpyro_uha import UHAGuide, UHALocalGuide
from numpyro_uha.evaluation import hais, log_z, to_inference_data

Y = jnp.array([0.3, -0.2, 0.9, 0.4])
KEY = jax.random.PRNGKey(1)


def model(y, scale=1.0):
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, scale), obs=y)


def model_with_kwargs(y, **options):
    model(y, **options)


def local_model(y):
    with numpyro.plate("n", y.shape[0]):
        z = numpyro.sample("z", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Normal(z, 0.5), obs=y)


def _fit(m, guide):
    svi = SVI(m, guide, optax.adam(1e-2), Trace_ELBO())
    return svi.get_params(svi.init(jax.random.PRNGKey(0), Y))


@pytest.fixture(scope="module")
def fitted():
    guide = UHAGuide(model, K=2, warm_start_steps=10)
    return guide, _fit(model, guide)


@pytest.mark.parametrize(
    "call, where, meant",
    [
        (lambda g, p: g.sample_posterior(KEY, p, Y, num_samples=10),
         "UHAGuide.sample_posterior", "sample_shape"),
        (lambda g, p: g.sample_posterior_with_log_weights(KEY, p, Y, num_draws=10),
         "UHAGuide.sample_posterior_with_log_weights", "sample_shape"),
        (lambda g, p: g.median(p, Y, num_draws=10), "UHAGuide.median", "num_samples"),
        (lambda g, p: g.quantiles(p, [0.5], Y, num_draw=10), "UHAGuide.quantiles", "num_samples"),
        (lambda g, p: log_z(g, KEY, p, Y, num_samples=10), "log_z", "num_draws"),
        (lambda g, p: hais(g, KEY, p, Y, num_samples=10), "hais", "num_draws"),
        (lambda g, p: to_inference_data(g, KEY, p, Y, num_draws=10), "to_inference_data",
         "num_samples"),
    ],
)
def test_an_unknown_keyword_is_named_with_the_option_meant(fitted, call, where, meant):
    guide, params = fitted
    with pytest.raises(TypeError, match=rf"{where}\(\) got the keyword argument .*"
                       rf"the model model\(y, scale\).*Did you mean {meant}="):
        call(guide, params)


def test_the_models_own_keywords_pass(fitted):
    guide, params = fitted
    draws = guide.sample_posterior(KEY, params, Y, scale=2.0, sample_shape=(5,))
    assert draws["mu"].shape == (5,)
    assert np.isfinite(log_z(guide, KEY, params, Y, scale=2.0, num_draws=20).elbo)


def test_a_model_taking_any_keyword_gets_it():
    """The check steps aside: such a model receives the keyword, as before."""
    guide = UHAGuide(model_with_kwargs, K=2, warm_start_steps=10)
    params = _fit(model_with_kwargs, guide)
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_samples'"):
        guide.sample_posterior(KEY, params, Y, num_samples=10)


def test_the_local_guide_names_it_too():
    guide = UHALocalGuide(local_model, K=2)
    params = _fit(local_model, guide)
    with pytest.raises(TypeError, match=r"UHALocalGuide.sample_posterior\(\) .*sample_shape="):
        guide.sample_posterior(KEY, params, Y, num_draws=10)
    with pytest.raises(TypeError, match=r"UHALocalGuide.log_z\(\) .*num_samples="):
        guide.log_z(KEY, params, Y, num_draws=10)
