"""The Inference Gym ports (numpyro_uha.models) against the Gym's own log density.

``benchmarks/reference/inference_gym.json`` holds the Gym's ``unnormalized_log_prob`` at
prior draws and near-posterior points (recorded by ``benchmarks/inference_gym_reference.py``
with inference-gym 0.0.5 / tfp-nightly); the ports' joint log density must agree up to
float32 round-off. The posterior-moment check against the Gym's ground truth is the
benchmark ``python -m benchmarks.inference_gym_ports`` (NUTS, minutes).
"""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.infer.util import log_density

from numpyro_uha.models import (
    BROWNIAN_OBSERVED_LOCS,
    LorenzBridgePrior,
    brownian_motion_model,
    lorenz_bridge_model,
)

REFERENCE = json.loads((Path(__file__).parents[1] / "benchmarks" / "reference" / "inference_gym.json").read_text())
MODELS = {"brownian_motion": brownian_motion_model, "lorenz_bridge": lorenz_bridge_model}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_log_density_matches_inference_gym(name):
    for point in REFERENCE[name]["points"]:
        params = {k: jnp.asarray(v, jnp.float32) for k, v in point.items() if k != "gym_log_prob"}
        ours, _ = log_density(MODELS[name], (), {}, params)
        gym = point["gym_log_prob"]
        # float32 sums of ~100 terms, some of magnitude |gym|: relative round-off ~1e-5.
        assert abs(float(ours) - gym) <= 1e-4 * max(1.0, abs(gym)), (name, float(ours), gym)


def test_lorenz_prior_sample_has_the_stated_transitions():
    prior = LorenzBridgePrior(num_steps=30, step_size=0.02, innovation_scale=0.1)
    paths = np.asarray(prior.sample(jax.random.PRNGKey(0), (400,)), np.float64)
    assert paths.shape == (400, 30, 3)
    x, y, z = paths[:, :-1, 0], paths[:, :-1, 1], paths[:, :-1, 2]
    drift = np.stack([10 * (y - x), x * (28 - z) - y, x * y - 8 / 3 * z], axis=-1)
    resid = (paths[:, 1:] - paths[:, :-1] - 0.02 * drift) / (np.sqrt(0.02) * 0.1)
    n = resid.size
    assert abs(resid.mean()) < 4 / np.sqrt(n)
    assert abs(resid.var() - 1) < 4 * np.sqrt(2 / n)
    init = paths[:, 0].ravel()
    assert abs(init.mean()) < 4 / np.sqrt(init.size) and abs(init.var() - 1) < 4 * np.sqrt(2 / init.size)
    # log_prob of a draw is finite and equals the sum of its Gaussian terms
    lp = prior.log_prob(jnp.asarray(paths[0], jnp.float32))
    expected = (-0.5 * (paths[0, 0] ** 2).sum() - 1.5 * np.log(2 * np.pi)
                - 0.5 * (resid[0] ** 2).sum() - resid[0].size * (np.log(np.sqrt(0.02) * 0.1) + 0.5 * np.log(2 * np.pi)))
    assert abs(float(lp) - expected) <= 1e-4 * abs(expected)


def test_bad_observations_are_named():
    with pytest.raises(ValueError, match="observed_locs"):
        log_density(brownian_motion_model, (np.zeros((2, 3)),), {}, {})
    with pytest.raises(ValueError, match="observed_values.*no observed"):
        log_density(lorenz_bridge_model, (np.full(5, np.nan),), {}, {})


def test_missing_observations_leave_the_latent_dimension():
    from numpyro import handlers

    tr = handlers.trace(handlers.seed(brownian_motion_model, 0)).get_trace()
    assert tr["locs"]["value"].shape == (30,)
    assert tr["obs"]["value"].shape == (int(np.sum(~np.isnan(BROWNIAN_OBSERVED_LOCS))),)


def test_brownian_reference_matches_prior_importance_sampling():
    """The quadrature reference against a brute-force estimate on a tiny series: Z =
    E_prior[p(y | locs, scales)] by Monte Carlo from the prior (float64 NumPy), and the
    posterior mean of the innovation scale by self-normalized weights; tolerances are 4
    delta-method standard errors."""
    from numpyro_uha.models import brownian_motion_reference

    observed = np.array([0.3, np.nan, -0.4, 0.1])
    ref = brownian_motion_reference(observed, num_grid=300)
    rng = np.random.default_rng(0)
    n = 400_000
    s_inn = np.exp(2.0 * rng.standard_normal(n))
    s_obs = np.exp(2.0 * rng.standard_normal(n))
    locs = np.cumsum(s_inn[:, None] * rng.standard_normal((n, 4)), axis=1)
    obs_idx = [0, 2, 3]
    resid = (observed[obs_idx] - locs[:, obs_idx]) / s_obs[:, None]
    log_w = (-0.5 * resid**2 - np.log(s_obs[:, None]) - 0.5 * np.log(2 * np.pi)).sum(1)
    top = log_w.max()
    w = np.exp(log_w - top)
    log_z = top + np.log(w.mean())
    log_z_se = w.std() / (np.sqrt(n) * w.mean())
    assert abs(ref["log_z"] - log_z) < 4 * log_z_se, (ref["log_z"], log_z, log_z_se)
    p = w / w.sum()
    mean = p @ s_inn
    mean_se = np.sqrt(np.sum(p**2 * (s_inn - mean) ** 2))
    assert abs(ref["mean"]["innovation_noise_scale"] - mean) < 4 * mean_se
    loc_mean = p @ locs[:, 1]
    loc_se = np.sqrt(np.sum(p**2 * (locs[:, 1] - loc_mean) ** 2))
    assert abs(ref["mean"]["locs"][1] - loc_mean) < 4 * loc_se
    assert ref["edge_mass"] < 1e-3
