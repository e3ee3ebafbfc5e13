"""What a draw call reads from the params is kept for the same params (a repeated call
reads nothing back), and still says what it said before at every call."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO

from numpyro_uha import UHADivergenceWarning, UHAGuide


def model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


Y = jnp.asarray(np.random.default_rng(1).normal(size=8), jnp.float32)


@pytest.fixture(scope="module")
def fitted():
    guide = UHAGuide(model, K=2, warm_start_steps=0)
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(0), Y)
    return guide, svi.get_params(state)


def _divergence_warnings(guide, params, calls):
    said = []
    for i in range(calls):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            guide.sample_posterior(jax.random.PRNGKey(i), params, Y, sample_shape=(16,))
        said.append([w for w in caught if issubclass(w.category, UHADivergenceWarning)])
    return said


def test_params_whose_training_diverged_warn_at_every_draw_call(fitted):
    guide, params = fitted
    assert _divergence_warnings(guide, params, 2) == [[], []]
    latched = {**params, guide._latch_name: params[guide._latch_name] + 1}
    said = _divergence_warnings(guide, latched, 3)
    assert [len(s) for s in said] == [1, 1, 1]
    assert all("in the params given" in str(s[0].message) for s in said)
    # and the clean params again: nothing
    assert _divergence_warnings(guide, params, 1) == [[]]


def test_nonfinite_params_raise_at_every_draw_call(fitted):
    guide, params = fitted
    name = next(n for n in params if n != guide._latch_name)
    broken = {**params, name: jnp.full_like(params[name], jnp.nan)}
    for i in range(2):
        with pytest.raises(FloatingPointError, match="NaN or inf"):
            guide.sample_posterior(jax.random.PRNGKey(i), broken, Y, sample_shape=(16,))


def test_draws_keep_the_shape_asked_for(fitted):
    guide, params = fitted
    for shape in [(5,), (2, 3), ()]:
        draws = guide.sample_posterior(jax.random.PRNGKey(0), params, Y, sample_shape=shape)
        assert draws["mu"].shape == shape
