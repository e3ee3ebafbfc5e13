"""A fit of another model or another K is refused with the parameter's name and what to
do, wherever it enters: draws, svi.run(init_params=...), svi.run(init_state=...)."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO

from numpyro_uha import UHAGuide

X = np.linspace(-1.0, 1.0, 12, dtype=np.float32)
Y = (0.5 + 2.0 * X).astype(np.float32)


def _regression(num_coefficients):
    def model(x, y):
        w = numpyro.sample("w", dist.Normal(0.0, 3.0).expand([num_coefficients]).to_event(1))
        mean = w[0] + w[1] * x + (w[2] * x**2 if num_coefficients > 2 else 0.0)
        with numpyro.plate("n", x.shape[0]):
            numpyro.sample("y", dist.Normal(mean, 0.5), obs=y)

    return model


def _fit(model, K):
    guide = UHAGuide(model, K=K, warm_start_steps=50)
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    result = svi.run(jax.random.PRNGKey(0), 5, X, Y, progress_bar=False)
    return guide, svi, result


@pytest.fixture(scope="module")
def two_coefficients():
    return _fit(_regression(2), K=2)


def test_a_changed_models_state_is_refused_naming_the_parameter(two_coefficients):
    _, _, old = two_coefficients
    model = _regression(3)
    guide = UHAGuide(model, K=2, warm_start_steps=50)
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    svi.init(jax.random.PRNGKey(0), X, Y)  # as load_fit's docstring resumes
    with pytest.raises(ValueError, match=r"shape \(2,\).*another guide's or another model's"):
        svi.run(jax.random.PRNGKey(0), 5, X, Y, progress_bar=False, init_state=old.state)
    with pytest.raises(ValueError, match=r"shape \(2,\).*another guide's or another model's"):
        svi.run(jax.random.PRNGKey(0), 5, X, Y, progress_bar=False, init_params=old.params)


def test_another_ks_params_are_refused_naming_both_ks(two_coefficients):
    _, _, old = two_coefficients
    guide = UHAGuide(_regression(2), K=8, warm_start_steps=50)
    svi = SVI(_regression(2), guide, optax.adam(1e-3), Trace_ELBO())
    svi.init(jax.random.PRNGKey(0), X, Y)
    with pytest.raises(ValueError, match="K = 2 transitions, this guide has K = 8"):
        guide.sample_posterior(jax.random.PRNGKey(1), old.params, X, Y, sample_shape=(4,))
    with pytest.raises(ValueError, match="K = 2 transitions, this guide has K = 8"):
        svi.run(jax.random.PRNGKey(0), 5, X, Y, progress_bar=False, init_params=old.params)


def test_this_guides_own_params_pass_under_jit(two_coefficients):
    guide, svi, result = two_coefficients
    state, loss = jax.jit(svi.update)(result.state, X, Y)
    assert np.isfinite(float(loss))
    draws = guide.sample_posterior(jax.random.PRNGKey(1), result.params, X, Y, sample_shape=(4,))
    assert draws["w"].shape == (4, 2)
    assert jnp.all(jnp.isfinite(draws["w"]))
