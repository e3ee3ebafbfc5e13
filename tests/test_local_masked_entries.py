"""UHALocalGuide on local latents the model masks out (``obs_mask`` inside the data plate).

``obs_mask`` adds a latent ``"<name>_unobserved"`` inside the plate, masked out where the
data are observed: each data point's target is flat along it there. Before, the chains'
q_i widened without end and the ELBO rose past log Z (silently). The guide completes
those entries as ``UHAGuide`` does (tests/test_masked_entries.py): a standard normal
density on their unconstrained coordinates, so log p(x_i) is the model's.
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
from scipy.stats import norm

from numpyro_uha import UHALocalGuide

N = 24
_rng = np.random.default_rng(3)
X = _rng.normal(0.0, np.sqrt(2.0), N)
MASK = _rng.uniform(size=N) > 0.35  # True: observed
POSITIVE = np.exp(_rng.normal(0.0, 1.0, N))


def normal_imputation(x, mask):
    with numpyro.plate("data", N):
        z = numpyro.sample("z", dist.Normal(0.0, 1.0))
        numpyro.sample("x", dist.Normal(z, 1.0), obs=x, obs_mask=mask)


def lognormal_imputation(x, mask):
    """A constrained (positive) imputed site: its Jacobian must leave the factor where
    its entries are completed."""
    with numpyro.plate("data", N):
        z = numpyro.sample("z", dist.Normal(0.0, 1.0))
        numpyro.sample("x", dist.LogNormal(z, 0.5), obs=x, obs_mask=mask)


@pytest.mark.parametrize(
    "model", [normal_imputation, pytest.param(lognormal_imputation, marks=pytest.mark.slow)]
)
def test_obs_mask_entries_are_completed_and_log_z_is_the_models(model):
    """log p(x_i) where observed (N(x_i; 0, √2); for the LogNormal, log x_i ~ N(0, √1.25)
    over x_i), 1 where missing: the importance-weighted estimate is within 4 standard
    errors of the sum and the ELBO below it."""
    if model is normal_imputation:
        data = X
        exact = float(norm.logpdf(X[MASK], 0.0, np.sqrt(2.0)).sum())
    else:
        data = POSITIVE
        exact = float((norm.logpdf(np.log(POSITIVE[MASK]), 0.0, np.sqrt(1.25))
                       - np.log(POSITIVE[MASK])).sum())
    args = (jnp.asarray(data), jnp.asarray(MASK))
    guide = UHALocalGuide(model, K=4, init_scale=1.0)  # the missing points' prior sds
    result = SVI(model, guide, optax.adam(1e-2), Trace_ELBO()).run(
        jax.random.PRNGKey(0), 400, *args, progress_bar=False
    )
    assert guide._completed_sites == ("x_unobserved",)
    est = guide.log_z(jax.random.PRNGKey(1), result.params, *args, num_samples=400)
    assert abs(est.total - exact) < 4 * est.total_se + 1e-3, (est, exact)
    assert est.total_elbo < exact + 4 * est.total_elbo_se, (est, exact)


def test_the_loss_is_minus_the_chains_log_weights_with_completed_constrained_entries():
    """Trace_ELBO's loss (whose model trace leaves the masked-out entries out) is exactly
    -Σ_i log w_i of the completed targets, draw for draw."""
    args = (jnp.asarray(POSITIVE), jnp.asarray(MASK))
    guide = UHALocalGuide(lognormal_imputation, K=3)
    params = SVI(lognormal_imputation, guide, optax.adam(1e-2), Trace_ELBO()).run(
        jax.random.PRNGKey(0), 20, *args, progress_bar=False
    ).params
    assert guide._completed_sites == ("x_unobserved",)
    for seed in range(3):
        key = jax.random.PRNGKey(seed)
        guide_key = jax.random.split(key)[1]  # Trace_ELBO seeds the guide with this
        _, log_w, _ = handlers.seed(
            handlers.substitute(lambda: guide._body(args, {}), data=params), guide_key
        )()
        loss = Trace_ELBO().loss(key, params, lognormal_imputation, guide, *args)
        np.testing.assert_allclose(loss, -float(jnp.sum(log_w)), rtol=1e-5)


def imputed_and_used(x, mask):
    """NumPyro's imputation idiom inside the plate: a masked-out prior whose value the
    likelihood uses is not flat, so it is left alone."""
    with numpyro.plate("data", N):
        z = numpyro.sample("z", dist.Normal(0.0, 1.0).mask(False))
        numpyro.sample("x", dist.Normal(z, 1.0), obs=x)


def test_a_masked_local_the_likelihood_uses_is_not_completed():
    guide = UHALocalGuide(imputed_and_used, K=2)
    SVI(imputed_and_used, guide, optax.adam(1e-2), Trace_ELBO()).init(
        jax.random.PRNGKey(0), jnp.asarray(X), jnp.asarray(MASK)
    )
    assert guide._completed_sites == ()
