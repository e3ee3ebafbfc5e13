"""The guide's Trace_ELBO term is the core's UHA log weight, draw by draw, on models
whose latent sites live on structured supports (a Cholesky factor of a correlation
matrix, a positive-definite matrix, a zero-sum vector, ordered cutpoints, an improper
prior, a mixture-distributed latent, a partly masked latent).

Each support has its own bijection and Jacobian; the chain's target (NumPyro's
potential energy) and the guide's emission (its values and Delta densities, what
Trace_ELBO scores) compute them apart, and must agree for the bound to be the one the
chain's weights give. One short model per support, with the ELBO-term helper of
tests/test_guide_weights.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro import handlers
from numpyro.infer import SVI, Trace_ELBO

from numpyro_uha import UHAGuide

from tests.test_guide_weights import elbo_terms_and_core_weights

Y = jnp.asarray(np.random.default_rng(0).normal(1.0, 1.0, 8), jnp.float32)


def lkj_cholesky(y):
    L = numpyro.sample("L", dist.LKJCholesky(3, 2.0))
    sd = numpyro.sample("sd", dist.HalfNormal(1.0).expand([3]).to_event(1))
    numpyro.sample(
        "obs", dist.MultivariateNormal(jnp.zeros(3), scale_tril=sd[:, None] * L),
        obs=y[:6].reshape(2, 3),
    )


def wishart(y):
    P = numpyro.sample("P", dist.Wishart(5.0, scale_matrix=jnp.eye(2)))
    numpyro.sample("obs", dist.MultivariateNormal(jnp.zeros(2), precision_matrix=P),
                   obs=y.reshape(4, 2))


def zero_sum(y):
    e = numpyro.sample("e", dist.ZeroSumNormal(1.0, event_shape=(4,)))
    numpyro.sample("obs", dist.Normal(e[jnp.arange(8) % 4], 1.0), obs=y)


def ordered_cutpoints(y):
    c = numpyro.sample("c", dist.TransformedDistribution(
        dist.Normal(0.0, 3.0).expand([3]).to_event(1), dist.transforms.OrderedTransform()
    ))
    numpyro.sample("obs", dist.OrderedLogistic(jnp.zeros(8), c), obs=jnp.arange(8) % 4)


def improper_scale(y):
    s = numpyro.sample("s", dist.ImproperUniform(dist.constraints.positive, (), ()))
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
    numpyro.sample("obs", dist.Normal(mu, s), obs=y)


def mixture_latent(y):
    z = numpyro.sample("z", dist.MixtureSameFamily(
        dist.Categorical(probs=jnp.array([0.3, 0.7])), dist.Normal(jnp.array([-2.0, 2.0]), 1.0)
    ))
    numpyro.sample("obs", dist.Normal(z, 1.0), obs=y)


def partly_masked(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
    with numpyro.plate("g", 3), handlers.mask(mask=jnp.array([True, False, True])):
        a = numpyro.sample("a", dist.LogNormal(mu, 1.0))
    numpyro.sample("obs", dist.Normal(a[0] - a[2], 1.0), obs=y[0])


@pytest.mark.parametrize("model", [
    lkj_cholesky, wishart, zero_sum, ordered_cutpoints, improper_scale, mixture_latent,
    partly_masked,
], ids=lambda m: m.__name__)
def test_the_elbo_term_is_the_core_log_weight_on_each_support(model):
    guide = UHAGuide(model, K=3, warm_start_steps=0)
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    params = dict(svi.get_params(svi.init(jax.random.PRNGKey(0), Y)))
    # q's mean moved off its start: the chain runs where the Jacobians are not 1
    shift = np.random.default_rng(1).normal(size=params["auto_loc"].shape)
    params["auto_loc"] = params["auto_loc"] + 0.3 * jnp.asarray(shift, jnp.float32)
    elbo, log_w, _ = elbo_terms_and_core_weights(guide, params, model, Y, num_keys=3)
    assert np.all(np.isfinite(log_w))
    np.testing.assert_allclose(elbo, log_w, rtol=1e-5, atol=2e-3)
    assert np.std(log_w) > 1e-2
