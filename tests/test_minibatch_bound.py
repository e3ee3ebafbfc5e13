"""``numpyro_uha.evaluation.minibatch_bound``: the full-data bound from fresh minibatches."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from numpyro_uha.evaluation import MinibatchBound, minibatch_bound

N = 40
X = jnp.asarray(np.random.default_rng(2).normal(1.0, 1.5, N), jnp.float32)


def model(x, batch):
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("data", N, subsample_size=batch) as idx:
        numpyro.sample("x", dist.Normal(mu, sigma), obs=x[idx])


@pytest.fixture(scope="module")
def fitted():
    guide = AutoNormal(model)
    params = SVI(model, guide, optax.adam(3e-2), Trace_ELBO()).run(
        jax.random.PRNGKey(0), 300, X, N, progress_bar=False
    ).params
    return guide, params


def test_the_minibatch_estimate_is_unbiased_for_the_full_data_bound(fitted):
    """The mean of -loss over minibatches of 8 is within 4 standard errors of the
    full-data ELBO of the same guide (minibatch = the whole data, 20 000 particles, whose
    own standard error is added)."""
    guide, params = fitted
    estimate = minibatch_bound(jax.random.PRNGKey(1), model, guide, params, X, 8, num_batches=400)
    assert isinstance(estimate, MinibatchBound) and estimate.num_batches == 400
    particles = jax.jit(
        lambda key: -Trace_ELBO(num_particles=20_000).loss(key, params, model, guide, X, N)
    )
    full = [float(particles(jax.random.PRNGKey(100 + k))) for k in range(4)]
    full_se = np.std(full, ddof=1) / 2.0
    assert abs(estimate.bound - np.mean(full)) < 4 * np.hypot(estimate.se, full_se), (
        estimate, full
    )
    # the same keys give the same estimate; the full data give (almost) no spread
    again = minibatch_bound(jax.random.PRNGKey(1), model, guide, params, X, 8, num_batches=400)
    assert again == estimate
    whole = minibatch_bound(jax.random.PRNGKey(1), model, guide, params, X, N, num_batches=50)
    assert whole.se < estimate.se


def test_bad_input_and_a_nonfinite_bound_are_named(fitted):
    guide, params = fitted
    with pytest.raises(ValueError, match="num_batches must be an integer of at least 2"):
        minibatch_bound(jax.random.PRNGKey(1), model, guide, params, X, 8, num_batches=1)
    bad = X.at[3].set(jnp.nan)
    with pytest.raises(FloatingPointError, match="not finite on"):
        minibatch_bound(jax.random.PRNGKey(1), model, guide, params, bad, N, num_batches=3)
