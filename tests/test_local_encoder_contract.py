"""UHALocalGuide with an encoder and its set-up, where a twelfth hunt found them wrong:
missing data held as NaN under ``obs_mask`` were refused, a failed set-up left the guide
half set up, a factor likelihood fed the encoder an empty dict, params without the model's
or the encoder's parameters ran on their initial values, and an encoder's output of the
wrong kind gave raw errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO

from numpyro_uha import UHALocalGuide

N, B, D = 24, 8, 3
_rng = np.random.default_rng(0)
X = jnp.asarray(_rng.normal(size=(N, D)), jnp.float32)


def model(x, batch):
    w = numpyro.param("decoder_w", jnp.ones(D))
    with numpyro.plate("data", x.shape[0], subsample_size=batch) as idx:
        z = numpyro.sample("z", dist.Normal(0.0, 1.0))
        numpyro.sample("x", dist.Normal(z[:, None] * w, 1.0).to_event(1), obs=x[idx])


def encoder(x):
    w = numpyro.param("encoder_w", jnp.zeros((D, 1)))
    return x @ w, jnp.ones((x.shape[0], 1))


def _fit(guide, steps=20, *args):
    svi = SVI(model, guide, optax.adam(1e-2), Trace_ELBO())
    return svi.run(jax.random.PRNGKey(0), steps, *(args or (X, B)), progress_bar=False)


def test_missing_data_held_as_nan_under_obs_mask_train():
    # NumPyro's obs_mask (and handlers.mask) wrap the site's distribution, without a
    # "mask" entry: the check for NaN data read only that entry and refused the model
    mask = jnp.asarray(_rng.random((N, D)) > 0.25)
    x = jnp.where(mask, X, jnp.nan)

    def masked_model(x, mask, batch):
        with numpyro.plate("data", x.shape[0], subsample_size=batch, dim=-2) as idx:
            z = numpyro.sample("z", dist.Normal(0.0, 1.0).expand([1, 1]).to_event(1))
            with numpyro.plate("cols", D, dim=-1):
                numpyro.sample("x", dist.Normal(z[..., 0], 1.0), obs=x[idx], obs_mask=mask[idx])

    guide = UHALocalGuide(masked_model, K=2)
    svi = SVI(masked_model, guide, optax.adam(1e-2), Trace_ELBO())
    result = svi.run(jax.random.PRNGKey(0), 30, x, mask, B, progress_bar=False)
    assert np.all(np.isfinite(result.losses))
    draws = guide.sample_posterior(jax.random.PRNGKey(1), result.params, x, mask, B,
                                   sample_shape=(5,), subsample_idx=jnp.arange(B))
    assert np.all(np.isfinite(draws["z"]))
    # a NaN that is not masked out (here: in every data point) is still refused
    unmasked = x.at[:, 0].set(jnp.nan)
    with pytest.raises(ValueError, match=r"'x_observed' has NaN or inf values for data point"):
        SVI(masked_model, UHALocalGuide(masked_model, K=2), optax.adam(1e-2), Trace_ELBO()).init(
            jax.random.PRNGKey(0), unmasked, mask.at[:, 0].set(True), B
        )


def test_a_failed_set_up_does_not_leave_the_guide_half_set_up():
    guide = UHALocalGuide(model, K=2, encoder=encoder)
    svi = SVI(model, guide, optax.adam(1e-2), Trace_ELBO())
    with pytest.raises(ValueError, match="NaN or inf"):
        svi.init(jax.random.PRNGKey(0), X.at[0, 0].set(jnp.nan), N)
    state = svi.init(jax.random.PRNGKey(0), X, B)  # the same guide, the call fixed
    assert np.isfinite(svi.evaluate(state, X, B))


def test_a_nan_in_a_minibatch_passed_to_the_model_names_its_row():
    def minibatch_model(x_batch, num_data):
        with numpyro.plate("data", num_data, subsample_size=x_batch.shape[0]):
            z = numpyro.sample("z", dist.Normal(0.0, 1.0))
            numpyro.sample("x", dist.Normal(z[:, None], 1.0).to_event(1), obs=x_batch)

    svi = SVI(minibatch_model, UHALocalGuide(minibatch_model, K=2, encoder=encoder),
              optax.adam(1e-2), Trace_ELBO())
    with pytest.raises(ValueError, match=r"the minibatch's rows \[2\]"):
        svi.init(jax.random.PRNGKey(0), X[:B].at[2, 1].set(jnp.inf), N)


def test_a_factor_likelihood_with_an_encoder_is_refused_with_the_reason():
    def factor_model(x, batch):
        with numpyro.plate("data", x.shape[0], subsample_size=batch) as idx:
            z = numpyro.sample("z", dist.Normal(0.0, 1.0))
            numpyro.factor("loglik", dist.Normal(z[:, None], 1.0).log_prob(x[idx]).sum(-1))

    svi = SVI(factor_model, UHALocalGuide(factor_model, K=2, encoder=encoder),
              optax.adam(1e-2), Trace_ELBO())
    with pytest.raises(ValueError, match=r"only numpyro.factor terms: \['loglik'\].*obs=data\[idx\]"):
        svi.init(jax.random.PRNGKey(0), X, B)


def test_params_without_the_models_or_the_encoders_parameters_are_refused():
    guide = UHALocalGuide(model, K=2, encoder=encoder)
    params = _fit(guide).params
    idx = jnp.arange(B)
    assert np.all(np.isfinite(guide.log_weights(jax.random.PRNGKey(1), params, X, B,
                                                num_samples=4, subsample_idx=idx)))
    for name, whose in (("decoder_w", "model"), ("encoder_w", "encoder")):
        partial_params = {k: v for k, v in params.items() if k != name}
        with pytest.raises(ValueError, match=rf"lacks the {whose}'s parameter\(s\) \['{name}'\]"):
            guide.sample_posterior(jax.random.PRNGKey(1), partial_params, X, B,
                                   sample_shape=(2,), subsample_idx=idx)
        with pytest.raises(ValueError, match=rf"lacks the {whose}'s parameter\(s\) \['{name}'\]"):
            guide.log_z(jax.random.PRNGKey(1), partial_params, X, B, num_samples=4,
                        subsample_idx=idx)


@pytest.mark.parametrize(
    "output, error, message",
    [
        (lambda x: (x[:, :1], jnp.ones((x.shape[0], 1)), None), TypeError,
         r"a pair \(loc, scale\).*got tuple of length 3"),
        (lambda x: {"loc": x[:, :1], "scale": jnp.ones((x.shape[0], 1))}, TypeError,
         r"a pair \(loc, scale\).*'z' 1.*got dict"),
        (lambda x: (x[:, :2], jnp.ones((x.shape[0], 2))), ValueError,
         r"shape \(8, 1\).*model's order: 'z' 1\), got \(8, 2\)"),
    ],
)
def test_an_encoders_output_of_the_wrong_kind_is_named(output, error, message):
    with pytest.raises(error, match=message):
        _fit(UHALocalGuide(model, K=2, encoder=output), 1)
