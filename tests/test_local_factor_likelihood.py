"""UHALocalGuide's warning for data that ignore the plate's indices, on a likelihood
written as ``numpyro.factor``.

The warning compared the observed sites' values under two index sets; a factor's value
is a constant placeholder (its data are in its log density), so a factor likelihood that
indexes its data correctly was warned about (the eleventh hunt). A factor is now compared
by its log density; one fed the minibatch (the indices unused) is still warned about."""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro import handlers

from numpyro_uha import UHALocalGuide

Y = jnp.asarray(np.random.default_rng(0).normal(size=40), jnp.float32)


def indexed(y, batch):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0], subsample_size=batch) as idx:
        z = numpyro.sample("z", dist.Normal(mu, 1.0))
        numpyro.factor("lik", dist.Normal(z, 1.0).log_prob(y[idx]))


def minibatch_passed(y_batch, num_data):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", num_data, subsample_size=y_batch.shape[0]):
        z = numpyro.sample("z", dist.Normal(mu, 1.0))
        numpyro.factor("lik", dist.Normal(z, 1.0).log_prob(y_batch))


def _index_warnings(model, *args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        handlers.seed(UHALocalGuide(model, K=2), 0)(*args)
    return [str(w.message) for w in caught if "whichever data points" in str(w.message)]


def test_a_factor_likelihood_is_warned_about_only_where_it_ignores_the_indices():
    assert _index_warnings(indexed, Y, 10) == []
    (message,) = _index_warnings(minibatch_passed, Y[:10], 40)
    assert "observed site(s) ['lik'] of the plate 'data'" in message
