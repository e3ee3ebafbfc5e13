"""UHALocalGuide on models with flat priors (``dist.ImproperUniform``), global or local.

Its setup traced the model with ``handlers.seed`` alone, so a site whose distribution
cannot be sampled raised a bare ``NotImplementedError`` at ``svi.init`` (global or local
site, real or positive support), where ``AutoNormal`` sets up (the eleventh hunt, docs/zoo.md).
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from numpyro.infer import SVI, Predictive, Trace_ELBO

from numpyro_uha import UHALocalGuide

N, BATCH = 40, 10
Y = jnp.asarray(np.random.default_rng(0).normal(1.0, 1.2, N), jnp.float32)
LOCAL_SD = 0.5  # z_i ~ Normal(mu, LOCAL_SD), y_i ~ Normal(z_i, 1): y_i ~ Normal(mu, √1.25)


def flat_global(y, batch):
    mu = numpyro.sample("mu", dist.ImproperUniform(dist.constraints.real, (), ()))
    with numpyro.plate("points", N, subsample_size=batch) as idx:
        z = numpyro.sample("z", dist.Normal(mu, LOCAL_SD))
        numpyro.sample("y", dist.Normal(z, 1.0), obs=y[idx])


def flat_local(y, batch):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    with numpyro.plate("points", N, subsample_size=batch) as idx:
        z = numpyro.sample("z", dist.ImproperUniform(dist.constraints.real, (batch,), ()))
        numpyro.factor("z_prior", dist.Normal(mu, LOCAL_SD).log_prob(z))
        numpyro.sample("y", dist.Normal(z, 1.0), obs=y[idx])


def proper_local(y, batch):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    with numpyro.plate("points", N, subsample_size=batch) as idx:
        z = numpyro.sample("z", dist.Normal(mu, LOCAL_SD))
        numpyro.sample("y", dist.Normal(z, 1.0), obs=y[idx])


def test_a_flat_local_prior_sets_up_and_its_chains_are_those_of_the_proper_prior():
    # the flat site plus a factor of Normal(mu, LOCAL_SD)'s log density is the same target
    # as the Normal site: the same parameters and key give the same chains' log weights
    flat, proper = UHALocalGuide(flat_local, K=4), UHALocalGuide(proper_local, K=4)
    svi = SVI(proper_local, proper, optax.adam(1e-3), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), Y, BATCH))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "site value already set" from the setup
        SVI(flat_local, flat, optax.adam(1e-3), Trace_ELBO()).init(jax.random.PRNGKey(0), Y, BATCH)
    idx, key = jnp.arange(3, 3 + BATCH), jax.random.PRNGKey(1)
    given = {"mu": jnp.asarray(1.0)}
    expected = proper.log_weights(
        key, params, Y, BATCH, num_samples=50, subsample_idx=idx, global_values=given
    )
    got = flat.log_weights(
        key, params, Y, BATCH, num_samples=50, subsample_idx=idx, global_values=given
    )
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)


def test_a_flat_global_prior_trains_to_the_exact_posterior_mean():
    # flat prior on mu: mu | y ~ Normal(mean(y), √(1.25 / N)) exactly
    guide = UHALocalGuide(flat_global, K=4)
    svi = SVI(flat_global, guide, optax.adam(1e-2), Trace_ELBO())
    result = svi.run(jax.random.PRNGKey(0), 1000, Y, 2 * BATCH, progress_bar=False)
    assert np.all(np.isfinite(result.losses))
    draws = guide.sample_posterior(
        jax.random.PRNGKey(1), result.params, Y, N, sample_shape=(500,)
    )
    exact_mean, exact_sd = float(Y.mean()), float(np.sqrt((1.0 + LOCAL_SD**2) / N))
    mu = np.asarray(draws["mu"])
    assert np.all(np.isfinite(mu)) and draws["z"].shape == (500, N)
    # the mean within half a posterior sd (the locally enhanced bound narrows the globals'
    # spread, docs/how-to/local-latents.md, but not their mean on this well-informed model)
    assert abs(mu.mean() - exact_mean) < 0.5 * exact_sd, (mu.mean(), exact_mean, exact_sd)
    predictive = Predictive(flat_global, guide=guide, params=result.params, num_samples=5)
    assert predictive(jax.random.PRNGKey(2), Y, 2 * BATCH)["y"].shape == (5, 2 * BATCH)
