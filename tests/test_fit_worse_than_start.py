"""The warning for a fit that training made worse than the Gaussian q it started from.

UHA's bound with ε → 0 is q's ELBO, so a trained UHA whose draws' log weights lie below
the starting q's ELBO was made worse by training (at high learning rates the annealing
parameters can drift until the dynamics break down, and the draws are then far from the
posterior with no other sign). ``UHAGuide.warn_if_worse_than_start`` is unit-tested on
synthetic log weights (the statistics), then end to end: a trained guide on a conjugate
model does not warn, and the same guide with q moved far from the posterior warns from
``sample_posterior`` and from ``log_z``.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO

from numpyro_uha import UHAFitWarning, UHAGuide
from numpyro_uha.evaluation import log_z

START = -40.0


def model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


Y = jax.random.normal(jax.random.PRNGKey(3), (20,)) + 1.5


@pytest.fixture(scope="module")
def fitted():
    guide = UHAGuide(model, K=4, warm_start_steps=300)
    svi = SVI(model, guide, optax.adam(1e-2), Trace_ELBO())
    result = svi.run(jax.random.PRNGKey(0), 300, Y, progress_bar=False)
    return guide, result.params


def _bare_guide(start=(START, 0.05)):
    guide = UHAGuide(model)
    guide._start_elbo = start
    return guide


def _warns(guide, log_w):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        returned = guide.warn_if_worse_than_start(log_w)
    fit = [w for w in caught if issubclass(w.category, UHAFitWarning)]
    assert returned == bool(fit)
    return fit


RNG = np.random.default_rng(0)


def test_no_warning_when_uha_improves_on_q():
    assert not _warns(_bare_guide(), START + 0.5 + RNG.standard_normal(2000))


def test_no_warning_within_the_noise():
    # 0.5 nat below with a standard error of 0.5: not significant, and under 1 nat
    assert not _warns(_bare_guide(), START - 0.5 + 20 * RNG.standard_normal(1600))


def test_warns_when_the_elbo_is_clearly_below_q():
    fit = _warns(_bare_guide(), START - 3.0 + RNG.standard_normal(2000))
    assert fit and "UHA ELBO" in str(fit[0].message) and "smaller learning rate" in str(fit[0].message)


def test_warns_when_most_log_weights_are_far_below_despite_huge_tails():
    # Training broke down: the mean's standard error (from a few enormous negative log
    # weights) hides the gap, the sign test does not.
    log_w = START - 3000.0 + 10.0 * RNG.standard_normal(2000)
    log_w[:5] = -1e18
    fit = _warns(_bare_guide(), log_w)
    assert fit and "100% of the log weights" in str(fit[0].message)


def test_few_draws_or_no_start_are_not_judged():
    assert not _warns(_bare_guide(), START - 100.0 + RNG.standard_normal(50))
    assert not _warns(_bare_guide(start=None), START - 100.0 + RNG.standard_normal(2000))


def test_warm_start_scores_its_q(fitted):
    guide, _ = fitted
    start, se = guide._start_elbo
    assert np.isfinite(start) and 0 < se < 1
    # the warm start's q is close to the exact posterior: its ELBO is close to log Z
    n, s0 = Y.shape[0], 10.0
    post_var = 1.0 / (1.0 / s0**2 + n)
    log_z_exact = (
        -0.5 * n * np.log(2 * np.pi) - 0.5 * float(jnp.sum(Y**2))
        + 0.5 * np.log(post_var / s0**2) + 0.5 * post_var * float(jnp.sum(Y)) ** 2
    )
    assert log_z_exact - 1.0 < start < log_z_exact + 4 * se


def test_trained_guide_does_not_warn(fitted):
    guide, params = fitted
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        guide.sample_posterior(jax.random.PRNGKey(1), params, Y, sample_shape=(1000,))
    assert not [w for w in caught if issubclass(w.category, UHAFitWarning)]


def test_broken_fit_warns_from_sample_posterior_and_log_z(fitted):
    guide, params = fitted
    # q moved 30 posterior sds off: the UHA draws start far out and K = 4 steps do not
    # bring them back, so their log weights are far below the warm start's ELBO
    broken = dict(params, auto_loc=params["auto_loc"] + 30 * params["auto_scale"])
    with pytest.warns(UHAFitWarning, match="worse than the Gaussian q it started from"):
        guide.sample_posterior(jax.random.PRNGKey(1), broken, Y, sample_shape=(1000,))
    with pytest.warns(UHAFitWarning, match="worse than the Gaussian q it started from"):
        log_z(guide, jax.random.PRNGKey(2), broken, Y, num_draws=1000)
