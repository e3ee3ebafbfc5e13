"""The setup warns where the posterior is improper: latent coordinates the model's log
density does not depend on (its gradient exactly zero at q's mean and at draws from q).
An improper prior on a latent nothing else uses makes such coordinates. The warning
names the site and exactly those positions, and is silent on proper posteriors,
including one whose gradient along a coordinate is tiny but not zero, and on entries the
model masks out (NumPyro's ``obs_mask`` makes those: the entries of
``<name>_unobserved`` where the data are observed), which the guide completes."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO

from numpyro_uha import UHAFitWarning, UHAGuide, UHAImproperPosteriorWarning

Y = jnp.linspace(-1.0, 1.0, 12)
MASK = jnp.arange(12) % 4 != 0  # observed everywhere but at 0, 4, 8


def imputation(y, mask):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y, obs_mask=mask)


def unused_improper(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    numpyro.sample("free", dist.ImproperUniform(dist.constraints.real, (), (2, 2)))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def nearly_flat(y):
    """Proper: ``wide``'s prior is all that depends on it, its gradient about 1e-5 at
    draws from q (a tolerance on the gradient instead of exact zeros would flag it)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    numpyro.sample("wide", dist.Normal(0.0, 1e5).expand([3]).to_event(1))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def set_up(model, *args, **guide_kwargs):
    guide = UHAGuide(model, K=2, warm_start_steps=100, **guide_kwargs)
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        svi.init(jax.random.PRNGKey(0), *args)
    return [w for w in caught if issubclass(w.category, UHAImproperPosteriorWarning)]


def test_obs_mask_entries_are_completed_not_warned_about():
    """The entries of ``y_unobserved`` where the data are observed are flat, but the
    model masks them out: the guide completes them (tests/test_masked_entries.py)
    instead of calling the posterior improper."""
    guide = UHAGuide(imputation, K=2, warm_start_steps=100)
    svi = SVI(imputation, guide, optax.adam(1e-3), Trace_ELBO())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        svi.init(jax.random.PRNGKey(0), Y, MASK)
    assert not [w for w in caught if issubclass(w.category, UHAImproperPosteriorWarning)]
    assert list(guide.completed_entries) == ["y_unobserved"]
    np.testing.assert_array_equal(guide.completed_entries["y_unobserved"], MASK)


def test_an_unused_improper_latent_is_named_with_its_positions():
    (caught,) = set_up(unused_improper, Y)
    assert issubclass(caught.category, UHAFitWarning)  # filtered with the fit warnings
    message = str(caught.message)
    assert "'free' at positions (0, 0), (0, 1), (1, 0), (1, 1) (" in message
    assert "'mu'" not in message


@pytest.mark.parametrize(
    "model, args",
    [(nearly_flat, (Y,)), (imputation, (Y, jnp.zeros(12, bool)))],
    ids=["tiny-gradient", "obs_mask-all-missing"],
)
def test_proper_posteriors_get_no_warning(model, args):
    assert set_up(model, *args) == []


def test_the_check_runs_after_init_from_too():
    """``init_from`` skips the warm start; the check uses the fitted q instead."""
    from numpyro.infer.autoguide import AutoNormal

    vi = AutoNormal(unused_improper)
    svi = SVI(unused_improper, vi, optax.adam(1e-2), Trace_ELBO())
    result = svi.run(jax.random.PRNGKey(0), 50, Y, progress_bar=False)
    (caught,) = set_up(unused_improper, Y, init_from=(vi, result.params))
    assert "'free'" in str(caught.message)
