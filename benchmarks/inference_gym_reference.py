"""Record the Inference Gym's own log density and ground truth for the ports in
:mod:`numpyro_uha.models` (run once, in an environment with the Gym; the result is
committed so that neither the tests nor the benchmarks need the Gym or TFP).

    python -m venv /tmp/gym && /tmp/gym/bin/pip install inference-gym tfp-nightly jax
    /tmp/gym/bin/python benchmarks/inference_gym_reference.py

Writes ``benchmarks/reference/inference_gym.json``: for each target, test points in the
ports' site layout with the Gym's ``unnormalized_log_prob`` at each, and the Gym's
ground-truth posterior mean and standard deviation (identity transformation) with their
standard errors. Does not import numpyro_uha (the Gym's environment need not have it).
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import jax
import numpy as np

OUT = Path(__file__).parent / "reference" / "inference_gym.json"


def _np(tree):
    return jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), tree)


def brownian(gym, key):
    model = gym.targets.BrownianMotionUnknownScalesMissingMiddleObservations()
    t = model.sample_transformations["identity"]
    k_prior, k_post = jax.random.split(key)
    mean, std = _np(t.ground_truth_mean), _np(t.ground_truth_standard_deviation)
    points = []
    for k in jax.random.split(k_prior, 4):  # one at a time: batched draws broadcast the scales
        prior = model.prior_distribution().sample(seed=k)
        points.append({
            "innovation_noise_scale": float(prior[0]),
            "observation_noise_scale": float(prior[1]),
            "locs": [float(prior[2 + j]) for j in range(30)],
        })
    for i, k in enumerate(jax.random.split(k_post, 4)):
        z = np.asarray(jax.random.normal(k, (32,)), np.float64) * 0.5
        points.append({
            "innovation_noise_scale": float(abs(mean["innovation_noise_scale"] + std["innovation_noise_scale"] * z[0])),
            "observation_noise_scale": float(abs(mean["observation_noise_scale"] + std["observation_noise_scale"] * z[1])),
            "locs": list(map(float, mean["locs"] + std["locs"] * z[2:])),
        })
    for p in points:
        value = (np.float32(p["innovation_noise_scale"]), np.float32(p["observation_noise_scale"]),
                 *[np.float32(v) for v in p["locs"]])
        p["gym_log_prob"] = float(model.unnormalized_log_prob(value))
    se_mean = _np(t.ground_truth_mean_standard_error)
    return {
        "gym_name": type(model).__name__,
        "points": points,
        "mean": {k: np.asarray(v).tolist() for k, v in mean.items()},
        "std": {k: np.asarray(v).tolist() for k, v in std.items()},
        "mean_se": {k: np.asarray(v).tolist() for k, v in se_mean.items()},
    }


def lorenz(gym, key):
    model = gym.targets.ConvectionLorenzBridge()
    t = model.sample_transformations["identity"]
    k_prior, k_post = jax.random.split(key)
    mean, std = _np(t.ground_truth_mean), _np(t.ground_truth_standard_deviation)
    mean, std = np.reshape(mean, (30, 3)), np.reshape(std, (30, 3))
    points = []
    for k in jax.random.split(k_prior, 4):
        prior = model.prior_distribution().sample(seed=k)
        points.append({"states": np.stack([np.asarray(p, np.float64) for p in prior]).tolist()})
    for k in jax.random.split(k_post, 4):
        z = np.asarray(jax.random.normal(k, (30, 3)), np.float64) * 0.5
        points.append({"states": (mean + std * z).tolist()})
    for p in points:
        states = np.asarray(p["states"], np.float32)
        p["gym_log_prob"] = float(model.unnormalized_log_prob([states[j] for j in range(30)]))
    se = t.ground_truth_mean_standard_error
    return {
        "gym_name": type(model).__name__,
        "points": points,
        "mean": {"states": mean.tolist()},
        "std": {"states": std.tolist()},
        "mean_se": {"states": np.reshape(np.asarray(se, np.float64), (30, 3)).tolist()},
    }


def main():
    import inference_gym.using_jax as gym

    key = jax.random.PRNGKey(20211206)
    k1, k2 = jax.random.split(key)
    payload = {
        "source": f"inference-gym {metadata.version('inference-gym')}, tfp-nightly {metadata.version('tfp-nightly')}",
        "command": "python benchmarks/inference_gym_reference.py",
        "brownian_motion": brownian(gym, k1),
        "lorenz_bridge": lorenz(gym, k2),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(payload, indent=1))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
