"""Latent entries a model masks out and nothing depends on (``obs_mask``'s
``"<name>_unobserved"`` where the data are observed, padding under
``numpyro.handlers.mask``): the guide completes them with a standard normal density
(``numpyro_uha/_masked.py``), so the posterior is proper and log Z is the model's."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro import handlers
from numpyro.infer import SVI, Trace_ELBO
from scipy import stats

from numpyro_uha import UHAGuide, UHAImproperPosteriorWarning
from numpyro_uha._masked import masked_out_entries
from numpyro_uha.evaluation import log_z
from test_guide_weights import elbo_terms_and_core_weights, perturbed_params

RNG = np.random.default_rng(0)
N = 12
OBSERVED = np.array([1, 1, 0, 1, 1, 1, 0, 1, 0, 1, 1, 0], bool)
X = (0.7 + RNG.normal(size=N)).astype(np.float32)
Y = (1.5 * X + 0.5 * RNG.normal(size=N)).astype(np.float32)
PRIOR_SD, SLOPE, NOISE = 2.0, 1.5, 0.5


def impute(x, y, observed):
    """x_i ~ N(mu, 1), some x_i missing (obs_mask), y_i ~ N(1.5 x_i, 0.5): Gaussian."""
    mu = numpyro.sample("mu", dist.Normal(0.0, PRIOR_SD))
    with numpyro.plate("n", y.shape[0]):
        x = numpyro.sample("x", dist.Normal(mu, 1.0), obs=x, obs_mask=observed)
        numpyro.sample("y", dist.Normal(SLOPE * x, NOISE), obs=y)


def exact_log_z(observed=OBSERVED):
    """log p(x_observed, y): (mu, x, y) are jointly Gaussian."""
    cov_x = PRIOR_SD**2 * np.ones((N, N)) + np.eye(N)
    cov = np.block([
        [cov_x, SLOPE * cov_x],
        [SLOPE * cov_x, SLOPE**2 * cov_x + NOISE**2 * np.eye(N)],
    ])
    keep = np.concatenate([observed, np.ones(N, bool)])
    value = np.concatenate([X, Y])[keep]
    return stats.multivariate_normal(np.zeros(keep.sum()), cov[np.ix_(keep, keep)]).logpdf(value)


@pytest.mark.slow
def test_obs_mask_entries_are_completed_and_log_z_is_the_models():
    guide = UHAGuide(impute, K=8)
    svi = SVI(impute, guide, optax.adam(1e-3), Trace_ELBO())
    with warnings.catch_warnings():
        warnings.simplefilter("error", UHAImproperPosteriorWarning)
        result = svi.run(jax.random.PRNGKey(0), 300, X, Y, OBSERVED, progress_bar=False)
    entries = guide.completed_entries
    assert list(entries) == ["x_unobserved"]
    np.testing.assert_array_equal(entries["x_unobserved"], OBSERVED)
    est = log_z(guide, jax.random.PRNGKey(1), result.params, X, Y, OBSERVED, num_draws=4000)
    exact = exact_log_z()
    # a lower bound in expectation, and unbiased for Z: the ELBO under log Z, the IW
    # estimate at it, both to their standard errors
    assert est.elbo < exact + 4 * est.elbo_se
    assert abs(est.iw - exact) < 4 * est.iw_se + 1e-3, (est, exact)
    # the fit is good enough that this measures something: the gap is small
    assert exact - est.elbo < 0.5
    # the training loss is the UHA bound (Trace_ELBO's log p leaves the entries out)
    assert abs(-float(np.mean(result.losses[-100:])) - est.elbo) < 0.5
    # draws on other data: two entries completed at setup are missing there (latent,
    # used): only what that call masks out is completed
    other = OBSERVED.copy()
    other[[0, 3]] = False
    est = log_z(guide, jax.random.PRNGKey(2), result.params, X, Y, other, num_draws=4000)
    assert abs(est.iw - exact_log_z(other)) < 4 * est.iw_se + 1e-3, (est, exact_log_z(other))


def padded(y, valid):
    """Groups of 4 observations, padded to 7 groups: the last 3 are masked out, their
    group mean m and positive scale s with them; a shared offset c that ``decenter``
    can non-center (loc mu, scale tau)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    c = numpyro.sample("c", dist.Normal(mu, tau))
    with numpyro.plate("g", y.shape[1]), handlers.mask(mask=valid):
        m = numpyro.sample("m", dist.Normal(mu, tau))
        s = numpyro.sample("s", dist.LogNormal(0.0, 0.5))
        with numpyro.plate("i", y.shape[0], dim=-2):
            numpyro.sample("y", dist.Normal(m + c, s), obs=y)


VALID = np.array([1, 1, 1, 1, 0, 0, 0], bool)
GROUPS = (RNG.normal(size=(4, 7)) + np.arange(7)).astype(np.float32) * VALID


@pytest.mark.parametrize("decenter", ["auto", False])
def test_trace_elbo_term_is_the_core_log_weight_with_completed_entries(decenter):
    """With completed entries of a positive site (its Jacobian) and of a real one, in a
    model with a non-centered site or not: NumPyro's Trace_ELBO on the model as
    written gets the core's weight, draw by draw."""
    guide = UHAGuide(padded, K=5, warm_start_steps=0, decenter=decenter)
    svi = SVI(padded, guide, optax.adam(1e-3), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), GROUPS, VALID))
    assert guide.decentered_sites == (("c",) if decenter else ())
    entries = guide.completed_entries
    assert sorted(entries) == ["m", "s"]
    for name in entries:
        np.testing.assert_array_equal(entries[name], ~VALID)
    params = perturbed_params(guide, params, seed=1)
    elbo, log_w, _ = elbo_terms_and_core_weights(guide, params, padded, GROUPS, VALID)
    np.testing.assert_allclose(elbo, log_w, rtol=1e-5, atol=2e-3)
    assert np.std(log_w) > 0.1


def test_a_masked_out_entry_the_model_uses_is_not_completed():
    """NumPyro's imputation idiom: a prior masked out with ``.mask(False)`` whose value
    the likelihood uses. The log density depends on it, so it keeps the model's
    (improper-prior) posterior, N(y, 1) here, not a completed one."""

    def model(y):
        with numpyro.plate("k", 3):
            z = numpyro.sample("z", dist.Normal(0.0, 1.0).mask(False))
            numpyro.sample("y", dist.Normal(z, 1.0), obs=y)

    y = jnp.array([3.0, -2.0, 5.0])
    guide = UHAGuide(model, K=4)
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), y))
    assert list(masked_out_entries(guide.prototype_trace)) == ["z"]  # masked out, but used
    assert guide.completed_entries == {}
    draws = guide.sample_posterior(jax.random.PRNGKey(1), params, y, sample_shape=(2000,))["z"]
    se = np.asarray(draws).std(0) / np.sqrt(2000)
    np.testing.assert_array_less(np.abs(np.asarray(draws).mean(0) - y), 5 * se + 0.05)


@pytest.mark.parametrize("prior", [dist.Normal(0.0, 1.0), dist.Gamma(2.0, 1.0)],
                         ids=["real", "positive"])
def test_an_unused_masked_out_event_is_completed(prior):
    """A latent vector masked out as a whole (``.mask(False).to_event(1)``) that nothing
    uses: completed (no improper-posterior warning), log Z the model's, N(y; 0, 2). On a
    positive support too: NumPyro's log |det J| of the site is not masked by a mask on the
    distribution (it is by ``handlers.mask``), so the entry was not flat (its density
    grew as e^z), was not completed, and every training loss was -inf."""

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        numpyro.sample("pad", prior.expand([3]).mask(False).to_event(1))
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    y = 1.3
    guide = UHAGuide(model, K=4)
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    with warnings.catch_warnings():
        warnings.simplefilter("error", UHAImproperPosteriorWarning)
        params = svi.get_params(svi.init(jax.random.PRNGKey(0), y))
    np.testing.assert_array_equal(guide.completed_entries["pad"], True)
    est = log_z(guide, jax.random.PRNGKey(1), params, y, num_draws=2000)
    exact = stats.norm(0.0, np.sqrt(2.0)).logpdf(y)
    assert abs(est.iw - exact) < 4 * est.iw_se + 1e-3, (est, exact)


def _scale_masked_by_the_distribution(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    s = numpyro.sample("s", dist.Gamma(2.0, 1.0).expand([2]).mask(jnp.array([False, True])))
    numpyro.sample("y", dist.Normal(mu, s[0]).expand([y.shape[0]]).to_event(1), obs=y)


def _scale_masked_by_a_handler(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with handlers.mask(mask=jnp.array([False, True])):
        s = numpyro.sample("s", dist.Gamma(2.0, 1.0).expand([2]))
    numpyro.sample("y", dist.Normal(mu, s[0]).expand([y.shape[0]]).to_event(1), obs=y)


@pytest.mark.parametrize("model", [_scale_masked_by_the_distribution, _scale_masked_by_a_handler],
                         ids=["distribution-mask", "handler-mask"])
def test_a_used_masked_out_entry_of_a_positive_site_keeps_the_elbo_term_the_log_weight(model):
    """s[0] masked out (no prior) but the likelihood's scale, s[1] counted: Trace_ELBO's
    term has s[0]'s density flat in s (the model scores nothing, the guide's density of s
    carries the Jacobian), and so must the chain's target, with s[0]'s log |det J|. With
    handlers.mask NumPyro's potential drops it (the target was flat in log s: terms
    0.02 relative off the weights); with .mask() it keeps it. Both masks alike, s[0] not
    completed, s[1] counted."""
    y = jnp.asarray(RNG.normal(1.0, 1.5, size=20), jnp.float32)
    guide = UHAGuide(model, K=4, warm_start_steps=0)
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    params = perturbed_params(guide, svi.get_params(svi.init(jax.random.PRNGKey(0), y)), seed=1)
    assert guide.completed_entries == {}
    elbo, log_w, _ = elbo_terms_and_core_weights(guide, params, model, y)
    np.testing.assert_allclose(elbo, log_w, rtol=1e-5, atol=2e-3)
    assert np.std(log_w) > 0.1


def test_compare_with_nuts_leaves_the_completed_entries_out():
    """NUTS wanders without bound over the completed entries (1e14 on a regression):
    the comparison covers the other entries only, the missing ones included."""
    from numpyro_uha.evaluation import compare_with_nuts

    guide = UHAGuide(impute, K=4)
    svi = SVI(impute, guide, optax.adam(1e-3), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), X, Y, OBSERVED))
    reference = guide.sample_posterior(
        jax.random.PRNGKey(5), params, X, Y, OBSERVED, sample_shape=(1000,)
    )
    reference = {k: np.asarray(v, np.float64) for k, v in reference.items()}
    reference["x_unobserved"][:, OBSERVED] = 1e14 * RNG.normal(size=(1000, OBSERVED.sum()))
    cmp = compare_with_nuts(
        guide, jax.random.PRNGKey(1), params, X, Y, OBSERVED, mcmc_samples=reference
    )
    compared = cmp.table[cmp.table["site"] == "x_unobserved"]["index"].tolist()
    assert compared == [f"x_unobserved[{i}]" for i in np.flatnonzero(~OBSERVED)]
    assert cmp.cov_mae < 0.1 and cmp.mean_mae < 0.1
