"""The core's inputs, as a JAX user passes them (a twelfth hunt): a full-rank scale
trained as a whole matrix (its upper triangle moved the draws but not their density, and
training pushed the "lower bound" 9 nats above log Z), a log density that returns one
value per coordinate (a vector of wrong "log weights") or, for rows, one summed value,
and ``make_params`` given integers, lists or float64 arrays under x64."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_uha.core import make_params, uha_sample, uha_sample_rows

from tests._compat import enable_x64


def logdensity(z):
    return -0.5 * jnp.sum(z**2)


def test_a_full_rank_scale_counts_by_its_lower_triangle_only():
    lower = jnp.array([[1.0, 0.0], [0.3, 0.8]])
    upper = lower.at[0, 1].set(0.8)  # e.g. after gradient steps on the whole matrix
    key = jax.random.PRNGKey(0)
    base = make_params(jnp.zeros(2), lower, num_transitions=3, step_size=0.2)
    z_low, w_low, _ = uha_sample(key, logdensity, base)
    z_up, w_up, _ = uha_sample(key, logdensity, base._replace(scale=upper))
    # the same draw and the same weight: the upper entry means nothing to either
    np.testing.assert_array_equal(np.asarray(z_low), np.asarray(z_up))
    np.testing.assert_array_equal(np.asarray(w_low), np.asarray(w_up))

    def mean_log_w(scale):
        keys = jax.random.split(jax.random.PRNGKey(1), 64)
        return jnp.mean(jax.vmap(lambda k: uha_sample(k, logdensity, base._replace(scale=scale))[1])(keys))

    grad = jax.grad(mean_log_w)(upper)
    assert float(grad[0, 1]) == 0.0 and float(jnp.abs(grad[1, 0])) > 0


def test_a_log_density_of_the_wrong_shape_is_refused():
    params = make_params(jnp.zeros(3), jnp.ones(3), num_transitions=2)
    with pytest.raises(ValueError, match=r"must return a scalar .* returned shape \(3,\)"):
        uha_sample(jax.random.PRNGKey(0), lambda z: -0.5 * z**2, params)  # not summed
    rows = make_params(jnp.zeros((4, 2)), jnp.ones((4, 2)), num_transitions=2)
    with pytest.raises(ValueError, match=r"must return shape \(4,\) .* returned shape \(\)"):
        uha_sample_rows(jax.random.split(jax.random.PRNGKey(0), 4), logdensity, rows)  # summed
    # one value per row runs
    z, log_w, _ = uha_sample_rows(jax.random.split(jax.random.PRNGKey(0), 4),
                                  lambda z: -0.5 * jnp.sum(z**2, -1), rows)
    assert log_w.shape == (4,) and z.shape == (4, 2)


def test_make_params_takes_integers_lists_and_other_float_dtypes():
    assert make_params(jnp.zeros(2), jnp.ones(2), num_transitions=jnp.int32(3)).betas.shape == (3,)
    params = make_params([0, 0], [1, 1], num_transitions=2, momentum_scale=[1.0, 2.0])
    assert params.loc.dtype == jnp.result_type(float) and params.momentum_scale.dtype == params.loc.dtype
    assert np.isfinite(float(uha_sample(jax.random.PRNGKey(0), logdensity, params)[1]))
    with enable_x64(True):
        # a float32 model with float64 NumPy options: the chain's carried types stay float32
        loc = jnp.zeros(2, jnp.float32)
        for name in ("momentum_scale", "drift_scale", "force_limit", "bridge_loc_slope"):
            params = make_params(loc, jnp.ones(2, jnp.float32), num_transitions=2,
                                 **{name: np.ones(2)})
            log_w = uha_sample(jax.random.PRNGKey(0), logdensity, params)[1]
            assert log_w.dtype == jnp.float32 and np.isfinite(float(log_w)), name


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(momentum_scale=jnp.ones(3)), r"momentum_scale must have 2 entries .* got shape \(3,\)"),
        (dict(scale=jnp.ones(3)), r"scale must have shape \(d,\) .* d = 2 .* got \(3,\)"),
        (dict(num_transitions=-1), r"num_transitions must be an integer ≥ 0, got -1"),
        (dict(num_transitions=2.5), r"num_transitions must be an integer ≥ 0, got 2.5"),
        (dict(damping=1.2), r"damping \(η\) must be in \[0, 1\]"),
    ],
)
def test_make_params_names_a_bad_input(kwargs, message):
    options = {"scale": jnp.ones(2), "num_transitions": 2, **kwargs}
    with pytest.raises(ValueError, match=message):
        make_params(jnp.zeros(2), **options)
