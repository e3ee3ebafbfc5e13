"""The log Z estimators on inputs a twelfth hunt found them unclear about: NaN data
(blamed on the step size), an unchecked ``batch_size`` (raw errors, or 0 taken as the
default), params of another model's guide (NumPyro's bare AssertionError), and reverse
chains of ``sandwich`` that diverged (left out of its upper bounds without a word)."""

from __future__ import annotations

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
from numpyro_uha.core import make_params
from numpyro_uha.evaluation import annealed_sandwich, hais, log_z, sandwich


def model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0).expand([y.shape[-1]]).to_event(1))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0).to_event(1), obs=y)


def _fit(dim):
    y = jnp.asarray(np.random.default_rng(0).normal(size=(10, dim)), jnp.float32)
    guide = UHAGuide(model, K=2, warm_start_steps=0)
    svi = SVI(model, guide, optax.adam(5e-3), Trace_ELBO())
    return guide, svi.run(jax.random.PRNGKey(0), 5, y, progress_bar=False).params, y


@pytest.fixture(scope="module")
def fitted():
    return _fit(3)


def _posterior(y, num=20):
    return {"mu": jnp.asarray(np.random.default_rng(1).normal(size=(num, y.shape[-1])), jnp.float32)}


ESTIMATORS = {
    "log_z": lambda g, p, y, **kw: log_z(g, jax.random.PRNGKey(1), p, y, num_draws=20, **kw),
    "hais": lambda g, p, y, **kw: hais(g, jax.random.PRNGKey(1), p, y, num_draws=20, **kw),
    "sandwich": lambda g, p, y, **kw: sandwich(g, jax.random.PRNGKey(1), p, _posterior(y), y, **kw),
}


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_nan_data_are_named_not_blamed_on_the_step_size(fitted, name):
    guide, params, y = fitted
    with pytest.raises(ValueError, match=r"the data are not finite: observed site\(s\) 'y'"):
        ESTIMATORS[name](guide, params, y.at[0, 0].set(jnp.nan))


@pytest.mark.parametrize("name", list(ESTIMATORS))
@pytest.mark.parametrize("batch_size", [-1, 0, 2.5])
def test_a_bad_batch_size_is_refused(fitted, name, batch_size):
    guide, params, y = fitted
    with pytest.raises(ValueError, match=rf"batch_size must be an integer >= 1, got {batch_size}"):
        ESTIMATORS[name](guide, params, y, batch_size=batch_size)


def test_params_of_another_models_guide_are_refused_naming_the_shapes(fitted):
    guide, params, y = fitted
    _, other_params, _ = _fit(5)
    with pytest.raises(ValueError, match=r"params\['auto_loc'\] has shape \(5,\), this guide's has \(3,\)"):
        log_z(guide, jax.random.PRNGKey(1), other_params, y, num_draws=20)
    with pytest.raises(ValueError, match="another guide's or another model's"):
        guide.sample_posterior(jax.random.PRNGKey(1), other_params, y, sample_shape=(2,))


def test_sandwich_counts_and_warns_about_diverged_reverse_chains():
    # a normalized Gaussian (log Z = 0) with one coordinate of sd 0.01: leapfrog steps of
    # 0.16 are unstable there, so most reverse chains from exact draws diverge
    scales = jnp.array([1.0, 1.0, 1.0, 0.01])

    def logdensity(z):
        return jnp.sum(-0.5 * (z / scales) ** 2 - jnp.log(scales) - 0.5 * jnp.log(2 * jnp.pi))

    params = make_params(jnp.zeros(4), scales, num_transitions=8)
    posterior = np.random.default_rng(0).normal(size=(200, 4)) * np.asarray(scales)
    stable = annealed_sandwich(jax.random.PRNGKey(0), logdensity, params, posterior)
    assert stable.num_reverse_nonfinite == 0 and "diverged" not in str(stable)
    unstable = params._replace(step_sizes=jnp.full_like(params.betas, 0.16))
    with pytest.warns(UHAFitWarning, match=r"of 200 reverse chains diverged") as caught:
        result = annealed_sandwich(jax.random.PRNGKey(0), logdensity, unstable, posterior)
    assert caught[0].filename == __file__
    assert 0 < result.num_reverse_nonfinite < 200 and result.num_reverse == 200
    assert f"{result.num_reverse_nonfinite} of 200 reverse chains diverged" in str(result)


def test_finite_data_and_params_still_estimate(fitted):
    guide, params, y = fitted
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UHAFitWarning)  # 5 training steps
        assert np.isfinite(log_z(guide, jax.random.PRNGKey(1), params, y, num_draws=20, batch_size=8).iw)


def test_data_in_the_posterior_samples_slot_is_named(fitted):
    # sandwich(guide, key, params, y): the data where the dict of draws belongs
    guide, params, y = fitted
    with pytest.raises(TypeError, match=r"posterior_samples must be a dict \{site name: draws\}.*got ArrayImpl"):
        sandwich(guide, jax.random.PRNGKey(1), params, y)
