"""Latent sites in a plate inside ``numpyro.contrib.control_flow.scan``.

A scan step's plates leave no plate site in the model's trace, and NumPyro's
AutoContinuous setup looked each latent site's plate up among those: every AutoContinuous
guide raised ``KeyError: '<plate>'`` on such a model (several series' latent states in one
scan). ``UHAGuide`` registers those plates (``guide._ScannedPlates``).
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from numpyro.contrib.control_flow import scan
from numpyro.infer import SVI, Predictive, Trace_ELBO
from scipy.stats import halfnorm, norm

from numpyro_uha import UHAGuide

from tests.test_guide_weights import elbo_terms_and_core_weights

T, N = 8, 3
Y = jnp.asarray(
    np.cumsum(np.random.default_rng(0).normal(size=(T, N)) * 0.3, axis=0)
    + 0.5 * np.random.default_rng(1).normal(size=(T, N)),
    jnp.float32,
)


def random_walks(y):
    """N Gaussian random walks observed with noise, one scan over time, a plate over the
    series inside its step."""
    s = numpyro.sample("s", dist.HalfNormal(1.0))

    def step(h_prev, y_t):
        with numpyro.plate("series", y.shape[1]):
            h = numpyro.sample("h", dist.Normal(h_prev, s))
            numpyro.sample("y", dist.Normal(h, 0.5), obs=y_t)
        return h, None

    scan(step, jnp.zeros(y.shape[1]), y)


def test_a_plate_inside_scan_sets_up_targets_the_model_and_keeps_the_elbo_the_weights():
    guide = UHAGuide(random_walks, K=3, warm_start_steps=0)
    svi = SVI(random_walks, guide, optax.adam(1e-3), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), Y))
    h = np.asarray(Y, np.float64) + 0.1
    s = 0.4
    z = guide.latent_from_samples({"s": jnp.array(s), "h": jnp.asarray(h, jnp.float32)}, Y)
    previous = np.concatenate([np.zeros((1, N)), h[:-1]])
    by_hand = (
        halfnorm.logpdf(s) + np.log(s) + norm.logpdf(h, previous, s).sum()
        + norm.logpdf(np.asarray(Y), h, 0.5).sum()
    )
    np.testing.assert_allclose(float(guide.get_logdensity_fn(params, Y)(z)), by_hand, rtol=1e-5)
    terms, log_w, _ = elbo_terms_and_core_weights(guide, params, random_walks, Y, num_keys=3)
    np.testing.assert_allclose(terms, log_w, rtol=1e-5, atol=2e-3)
    draws = guide.sample_posterior(jax.random.PRNGKey(1), params, Y, sample_shape=(4,))
    assert draws["h"].shape == (4, T, N)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        predicted = Predictive(random_walks, guide=guide, params=params, num_samples=4)(
            jax.random.PRNGKey(2), Y
        )
    assert predicted["y"].shape == (4, T, N)
