"""Latent sites inside NumPyro's control flow (``numpyro.contrib.control_flow``).

``scan``: a step's plates leave no plate site in the model's trace, and NumPyro's
AutoContinuous setup looked each latent site's plate up among those: every AutoContinuous
guide raised ``KeyError: '<plate>'`` on such a model (several series' latent states in one
scan). ``UHAGuide`` registers those plates (``guide._ScannedPlates``).

``cond``: NumPyro 0.22's does not replay a guide's values, so every ELBO's loss is wrong
on a model with a latent site inside it; ``UHAGuide`` refuses such a model at setup with
the rewrite that works, where the installed NumPyro has the bug (probed).

``UHALocalGuide`` on a ``scan`` model: its chains' target ran the model unseeded inside
the chain's JAX loop, and the scan's key leaked a tracer at ``svi.init``.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.contrib.control_flow import cond, scan
from numpyro.infer import SVI, Predictive, Trace_ELBO
from scipy.stats import halfnorm, norm

from numpyro_uha import UHAGuide
from numpyro_uha.guide import _cond_replays

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


def branching(y):
    a = numpyro.sample("a", dist.Normal(0.0, 1.0))
    b = cond(a > 0, lambda _: numpyro.sample("b", dist.Normal(1.0, 1.0)),
             lambda _: numpyro.sample("b", dist.Normal(-1.0, 1.0)), None)
    numpyro.sample("y", dist.Normal(a + b, 1.0), obs=y)


def test_a_latent_site_inside_cond_is_refused_where_cond_does_not_replay():
    """The probe's answer is what the model does under replay; where cond does not
    replay, the guide refuses the model with the rewrite, and where it does, Trace_ELBO's
    terms are the core's weights."""
    y = jnp.asarray(np.random.default_rng(0).normal(size=8) + 1.0, jnp.float32)
    guide_trace = numpyro.handlers.trace(numpyro.handlers.seed(
        lambda: (numpyro.sample("a", dist.Delta(jnp.asarray(-0.8))),
                 numpyro.sample("b", dist.Delta(jnp.asarray(0.9)))), 0
    )).get_trace()
    model_trace = numpyro.handlers.trace(numpyro.handlers.seed(
        numpyro.handlers.replay(branching, trace=guide_trace), 1
    )).get_trace(y)
    # the y site's mean is a + (the b the model went on with)
    went_on_with = float(jnp.ravel(model_trace["y"]["fn"].loc)[0]) - (-0.8)
    assert _cond_replays() == (abs(went_on_with - 0.9) < 1e-5)
    guide = UHAGuide(branching, K=3, warm_start_steps=0)
    svi = SVI(branching, guide, optax.adam(1e-3), Trace_ELBO())
    if not _cond_replays():
        with pytest.raises(ValueError, match=r"\['b'\] are sampled inside numpyro.contrib.control_flow.cond"):
            svi.init(jax.random.PRNGKey(0), y)
        return
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), y))
    terms, log_w, _ = elbo_terms_and_core_weights(guide, params, branching, y, num_keys=3)
    np.testing.assert_allclose(terms, log_w, rtol=1e-5, atol=2e-3)



def observed_in_cond(y, robust):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    cond(robust, lambda _: numpyro.sample("y", dist.Normal(mu, 3.0), obs=y),
         lambda _: numpyro.sample("y", dist.Normal(mu, 1.0), obs=y), None)


def test_log_z_of_any_guide_refuses_latent_sites_inside_cond():
    """log_z of a NumPyro guide (here AutoNormal) on a model with a latent site inside
    cond ran on wrong terms (only a standard-error warning); it is refused as UHAGuide
    refuses the model, where cond does not replay. An observed site inside cond is fine."""
    from numpyro.infer.autoguide import AutoNormal

    from numpyro_uha.evaluation import guide_log_weights, log_z

    y = jnp.asarray(np.random.default_rng(0).normal(size=8) + 1.0, jnp.float32)
    guide = AutoNormal(branching)
    svi = SVI(branching, guide, optax.adam(1e-3), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), y))
    if _cond_replays():
        log_z(guide, jax.random.PRNGKey(1), params, y, num_draws=50)
        return
    match = r"\['b'\] are sampled inside numpyro.contrib.control_flow.cond"
    with pytest.raises(ValueError, match=match):
        log_z(guide, jax.random.PRNGKey(1), params, y, num_draws=50)
    with pytest.raises(ValueError, match=match):
        guide_log_weights(jax.random.PRNGKey(1), branching, guide, params, 50, y)
    guide = AutoNormal(observed_in_cond)
    svi = SVI(observed_in_cond, guide, optax.adam(1e-3), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), y, jnp.asarray(True)))
    estimate = log_z(guide, jax.random.PRNGKey(1), params, y, jnp.asarray(True), num_draws=50)
    assert np.isfinite(estimate.elbo)

def local_random_walks(y):
    """``random_walks`` with each series' start latent too: every series is a data point
    of ``UHALocalGuide`` (its plate is subsampled outside and inside the scan)."""
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    with numpyro.plate("series", y.shape[1]):
        h0 = numpyro.sample("h0", dist.Normal(0.0, 1.0))

    def step(h_prev, y_t):
        with numpyro.plate("series", y.shape[1]):
            h = numpyro.sample("h", dist.Normal(h_prev, s))
            numpyro.sample("y", dist.Normal(h, 0.5), obs=y_t)
        return h, None

    scan(step, h0, y)


def test_uha_local_guide_trains_on_a_scan_model():
    """The chains' target runs the model inside a JAX loop; NumPyro's scan draws a key,
    which (unseeded there) split the caller's key inside the loop and leaked a tracer."""
    from numpyro_uha import UHALocalGuide

    guide = UHALocalGuide(local_random_walks, K=2)
    svi = SVI(local_random_walks, guide, optax.adam(1e-3), Trace_ELBO())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = svi.run(jax.random.PRNGKey(0), 3, Y, progress_bar=False)
    assert np.all(np.isfinite(result.losses))
    assert set(guide._local_sites) == {"h0", "h"}
