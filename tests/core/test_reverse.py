"""Reverse (backward-path) annealing: the upper half of the log Z sandwich."""

import math

import jax
import numpy as np
import pytest

from numpyro_uha.core import reverse_annealed_sample

from tests.core.test_annealing import (
    DIM,
    LOG_Z,
    TARGET_MEAN,
    TARGET_STD,
    draw_log_weights,
    gaussian_target,
    random_params,
)


def reverse_log_weights(params, num_draws, seed=0, **kwargs):
    key_pos, key_chain = jax.random.split(jax.random.PRNGKey(seed))
    exact = TARGET_MEAN + TARGET_STD * jax.random.normal(key_pos, (num_draws, DIM))
    keys = jax.random.split(key_chain, num_draws)
    run = jax.jit(jax.vmap(
        lambda k, z: reverse_annealed_sample(k, gaussian_target, params, z, **kwargs)[1]
    ))
    return np.asarray(run(keys, exact), dtype=np.float64)


@pytest.mark.parametrize("integrator", ["velocity_verlet", "position_verlet"])
@pytest.mark.parametrize("corrected", [False, True], ids=["uha", "hais"])
def test_reverse_weights_estimate_one_over_z(corrected, integrator):
    """Started from exact posterior draws, E[1/w] = 1/Z for any parameters."""
    params = random_params(3, num_transitions=5, drift=integrator == "position_verlet")
    log_w = reverse_log_weights(params, 20_000, corrected=corrected, integrator=integrator)
    inv_w = np.exp(-(log_w - LOG_Z))  # = Z / w, mean one
    se = inv_w.std(ddof=1) / math.sqrt(inv_w.size)
    assert abs(inv_w.mean() - 1.0) < 4 * se, (inv_w.mean(), se)


@pytest.mark.parametrize("corrected", [False, True], ids=["uha", "hais"])
def test_sandwich_brackets_log_z(corrected):
    params = random_params(4, num_transitions=8)
    lower = draw_log_weights(params, 5000, seed=1, corrected=corrected)
    upper = reverse_log_weights(params, 5000, seed=2, corrected=corrected)
    se_lower = lower.std(ddof=1) / math.sqrt(lower.size)
    se_upper = upper.std(ddof=1) / math.sqrt(upper.size)
    assert lower.mean() < LOG_Z + 3 * se_lower
    assert upper.mean() > LOG_Z - 3 * se_upper
    # Both gaps are KL divergences: strictly positive for these untrained parameters.
    assert upper.mean() - lower.mean() > 3 * math.hypot(se_lower, se_upper)


def test_reverse_weight_is_the_forward_formula_on_the_backward_path():
    """log w = log p̄(z_{K+1}) - log q(z_1) + Σ_m [log S(ρ_{m+1}) - log S(ρ'_m)], with
    the info fields in forward terms (z_1 at the q end, per-step arrays in m order)."""
    from numpyro_uha.core import gaussian_logpdf

    params = random_params(5, num_transitions=3)
    z_end = TARGET_MEAN + 0.1
    z1, log_w, info = reverse_annealed_sample(jax.random.PRNGKey(1), gaussian_target, params, z_end)
    log_q = gaussian_logpdf(z1, params.loc, params.scale)
    expected = gaussian_target(z_end) - log_q + info.momentum_log_ratio.sum()
    np.testing.assert_allclose(log_w, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(info.log_q_initial, log_q, rtol=1e-6)
    np.testing.assert_allclose(info.initial_position, z1)
    # target_logdensity[m-1] = log p̄(z_m); the first entry is at z_1.
    np.testing.assert_allclose(info.target_logdensity[0], gaussian_target(z1), rtol=1e-5)
    assert info.target_logdensity.shape == (3,)
