"""The setup warns where the posterior is improper: latent coordinates the model's log
density does not depend on (its gradient exactly zero at q's mean and at draws from q).
An improper prior on a latent nothing else uses makes such coordinates. The warning
names the site and exactly those positions, and is silent on proper posteriors,
including one whose gradient along a coordinate is tiny but not zero, and on entries the
model masks out (NumPyro's ``obs_mask`` makes those: the entries of
``<name>_unobserved`` where the data are observed), which the guide completes. A flat
prior on an unbounded support other than the real line (positive, ordered) is flat in
the site's own value, not in the unconstrained coordinates: found with its log |det J|
left out, and not on a bounded support, where it is a proper uniform."""

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


def unused_flat_on(support, shape, used=None):
    """A flat improper prior on ``support`` (``ImproperUniform``), whose entries
    ``used`` the likelihood reads (none by default)."""

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        free = numpyro.sample("free", dist.ImproperUniform(support, (), shape))
        if used is not None:
            numpyro.sample("y_free", dist.Normal(free[used], 1.0), obs=y)
        with numpyro.plate("n", y.shape[0]):
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    return model


def nearly_flat(y):
    """Proper: ``wide``'s prior is all that depends on it, its gradient about 1e-5 at
    draws from q (a tolerance on the gradient instead of exact zeros would flag it)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    numpyro.sample("wide", dist.Normal(0.0, 1e5).expand([3]).to_event(1))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def set_up(model, *args, **guide_kwargs):
    guide_kwargs.setdefault("warm_start_steps", 100)
    guide = UHAGuide(model, K=2, **guide_kwargs)
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
    "support, used, named",
    [
        (dist.constraints.positive, 0, "'free' at positions 1, 2 ("),
        (dist.constraints.greater_than(2.0), None, "'free' at positions 0, 1, 2 ("),
        (dist.constraints.ordered_vector, None, "'free' at positions 0, 1, 2 ("),
    ],
    ids=["positive-one-used", "greater-than", "ordered"],
)
def test_a_flat_prior_on_an_unbounded_support_is_named(support, used, named):
    """In the unconstrained coordinates such a site's density is the map's log |det J|
    (z for a positive site), not flat: the setup finds it flat in the site's own value,
    where the support has infinite volume, and names exactly the entries nothing uses.
    The check probes at NumPyro's initial point, before any warm start (none here)."""
    (caught,) = set_up(unused_flat_on(support, (3,), used), Y, warm_start_steps=0)
    message = str(caught.message)
    assert named in message
    assert "flat in the site's own value" in message
    assert "'mu'" not in message


@pytest.mark.parametrize(
    "model, args",
    [
        (nearly_flat, (Y,)),
        (imputation, (Y, jnp.zeros(12, bool))),
        (unused_flat_on(dist.constraints.unit_interval, (3,)), (Y,)),
        (unused_flat_on(dist.constraints.positive, (), used=...), (Y,)),
    ],
    ids=["tiny-gradient", "obs_mask-all-missing", "flat-on-a-bounded-support", "flat-used"],
)
def test_proper_posteriors_get_no_warning(model, args):
    assert set_up(model, *args, warm_start_steps=0 if model.__name__ == "model" else 100) == []


def test_the_check_runs_after_init_from_too():
    """``init_from`` skips the warm start; the check uses the fitted q instead."""
    from numpyro.infer.autoguide import AutoNormal

    vi = AutoNormal(unused_improper)
    svi = SVI(unused_improper, vi, optax.adam(1e-2), Trace_ELBO())
    result = svi.run(jax.random.PRNGKey(0), 50, Y, progress_bar=False)
    (caught,) = set_up(unused_improper, Y, init_from=(vi, result.params))
    assert "'free'" in str(caught.message)
