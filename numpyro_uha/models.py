"""NumPyro ports of two Inference Gym time-series targets used in the paper (Section 5.3).

* :func:`brownian_motion_model` — ``BrownianMotionUnknownScalesMissingMiddleObservations``
  (d = 32): a 30-step Gaussian random walk with unknown innovation and observation scales
  (both LogNormal(0, 2)), observed with Gaussian noise except at the middle ten steps.
* :func:`lorenz_bridge_model` — ``ConvectionLorenzBridge`` (d = 90): a 30-step
  Euler–Maruyama discretization (step 0.02, innovation scale 0.1) of the Lorenz system,
  of which only the first component (convection) is observed with unit Gaussian noise,
  except at the middle ten steps.

Both are *centred* ports: the latent sites are the states themselves, as in the Inference
Gym, so the posterior geometry (and log Z) are the Gym's. The observations are the Gym's
checked-in synthetic data (Apache-2.0, ``inference_gym/internal/datasets``).
``benchmarks/inference_gym_reference.py`` records the Gym's own log density at test points
and its ground-truth posterior moments; the test suite checks the ports against the former,
``python -m benchmarks.inference_gym_ports`` against the latter. For Brownian motion the
exact posterior is available (:func:`brownian_motion_reference`): NUTS on the port agrees
with it, while the Gym's shipped ground truth for this target does not (it differs by up
to 13 Monte Carlo standard errors, e.g. observation-noise scale mean 0.101 against the
exact 0.1127), although the port's log density equals the Gym's at every test point.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints

__all__ = [
    "BROWNIAN_OBSERVED_LOCS",
    "LORENZ_OBSERVED_VALUES",
    "brownian_motion_model",
    "lorenz_bridge_model",
    "LorenzBridgePrior",
    "brownian_motion_reference",
]

_NAN = np.nan

#: Observed locations of the Gym's Brownian-motion data (NaN = missing).
BROWNIAN_OBSERVED_LOCS = np.array([
    0.21592641, 0.118771404, -0.07945447, 0.037677474, -0.27885845, -0.1484156,
    -0.3250906, -0.22957903, -0.44110894, -0.09830782, _NAN, _NAN, _NAN,
    _NAN, _NAN, _NAN, _NAN, _NAN, _NAN, _NAN, -0.8786016,
    -0.83736074, -0.7384849, -0.8939254, -0.7774566, -0.70238715, -0.87771565,
    -0.51853573, -0.6948214, -0.6202789,
], dtype=np.float32)

#: Observed convection values of the Gym's Lorenz-bridge data (NaN = missing).
LORENZ_OBSERVED_VALUES = np.array([
    -0.2761459, 0.18631345, 0.1467675, -1.3148443, -1.2150469, -0.44544014,
    -0.5505127, -0.9422926, -1.9986963, 0.13876402, _NAN, _NAN, _NAN,
    _NAN, _NAN, _NAN, _NAN, _NAN, _NAN, _NAN, -16.095385,
    -18.901144, -21.515736, -22.736586, -23.451488, -21.417793, -15.236895,
    -7.6766376, -0.19389218, 6.26647,
], dtype=np.float32)


def _observed(values, name):
    values = np.asarray(values, np.float32)
    if values.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of observations (NaN = missing), got shape {values.shape}.")
    mask = ~np.isnan(values)
    if not mask.any():
        raise ValueError(f"{name} has no observed (non-NaN) value.")
    return values, np.flatnonzero(mask)


def brownian_motion_model(observed_locs=BROWNIAN_OBSERVED_LOCS):
    """Brownian motion with unknown scales and missing middle observations.

    ``innovation_noise_scale, observation_noise_scale ~ LogNormal(0, 2)``;
    ``locs[0] ~ N(0, innovation_noise_scale)``, ``locs[t] ~ N(locs[t-1], innovation_noise_scale)``;
    ``observed_locs[t] ~ N(locs[t], observation_noise_scale)`` where not NaN.
    Latent sites ``innovation_noise_scale``, ``observation_noise_scale`` and ``locs``
    (length ``len(observed_locs)``), d = T + 2.
    """
    values, idx = _observed(observed_locs, "observed_locs")
    innovation = numpyro.sample("innovation_noise_scale", dist.LogNormal(0.0, 2.0))
    observation = numpyro.sample("observation_noise_scale", dist.LogNormal(0.0, 2.0))
    locs = numpyro.sample("locs", dist.GaussianRandomWalk(scale=innovation, num_steps=values.shape[0]))
    numpyro.sample("obs", dist.Normal(locs[idx], observation).to_event(1), obs=jnp.asarray(values[idx]))


def _lorenz_drift(state):
    x, y, z = state[..., 0], state[..., 1], state[..., 2]
    return jnp.stack([10.0 * (y - x), x * (28.0 - z) - y, x * y - 8.0 / 3.0 * z], axis=-1)


class LorenzBridgePrior(dist.Distribution):
    """Prior over a ``(num_steps, 3)`` Lorenz path: ``state[0] ~ N(0, I)``,
    ``state[t] ~ N(state[t-1] + step_size · f(state[t-1]), sqrt(step_size) · innovation_scale)``."""

    arg_constraints = {"innovation_scale": constraints.positive}
    support = constraints.independent(constraints.real, 2)
    reparametrized_params = ["innovation_scale"]

    def __init__(self, num_steps=30, step_size=0.02, innovation_scale=0.1, *, validate_args=None):
        self.num_steps = int(num_steps)
        self.step_size = float(step_size)
        self.innovation_scale = innovation_scale
        super().__init__(batch_shape=(), event_shape=(self.num_steps, 3), validate_args=validate_args)

    def _transition_scale(self):
        return jnp.sqrt(self.step_size) * self.innovation_scale

    def sample(self, key, sample_shape=()):
        k0, k1 = jax.random.split(key)
        init = jax.random.normal(k0, sample_shape + (3,))
        noise = jax.random.normal(k1, (self.num_steps - 1,) + sample_shape + (3,)) * self._transition_scale()

        def step(state, eps):
            new = state + self.step_size * _lorenz_drift(state) + eps
            return new, new

        _, path = jax.lax.scan(step, init, noise)
        path = jnp.concatenate([init[None], path], axis=0)
        return jnp.moveaxis(path, 0, -2)

    def log_prob(self, value):
        init = dist.Normal(0.0, 1.0).log_prob(value[..., 0, :]).sum(-1)
        prev = value[..., :-1, :]
        mean = prev + self.step_size * _lorenz_drift(prev)
        steps = dist.Normal(mean, self._transition_scale()).log_prob(value[..., 1:, :]).sum((-1, -2))
        return init + steps


def lorenz_bridge_model(observed_values=LORENZ_OBSERVED_VALUES, step_size=0.02, innovation_scale=0.1,
                        observation_scale=1.0):
    """Convection Lorenz bridge: the Lorenz path prior of :class:`LorenzBridgePrior` and
    ``observed_values[t] ~ N(state[t, 0], observation_scale)`` where not NaN.
    Latent site ``states`` of shape ``(len(observed_values), 3)``, d = 3T."""
    values, idx = _observed(observed_values, "observed_values")
    states = numpyro.sample("states", LorenzBridgePrior(values.shape[0], step_size, innovation_scale))
    numpyro.sample("obs", dist.Normal(states[idx, 0], observation_scale).to_event(1), obs=jnp.asarray(values[idx]))


def brownian_motion_reference(observed_locs=BROWNIAN_OBSERVED_LOCS, num_grid=400, log_scale_range=(-8.0, 4.0)):
    """Exact log Z and posterior moments of :func:`brownian_motion_model`, by quadrature.

    Given the two scales, the locations are jointly Gaussian with the observations, so
    ``p(y | scales)`` and ``E[locs | y, scales]``, ``Var[locs | y, scales]`` are closed-form
    (one eigendecomposition of the observed random-walk covariance serves the whole grid);
    the two log scales are integrated on a ``num_grid × num_grid`` uniform grid (Riemann sum) over
    ``log_scale_range`` (the LogNormal(0, 2) prior puts < 1e-4 mass outside the default
    range, and the posterior far less). Runs in NumPy float64, in about a second.

    Returns:
        dict with ``log_z``, ``mean`` and ``std`` (dicts keyed by site name, as the model's
        sites ``innovation_noise_scale``, ``observation_noise_scale``, ``locs``) and
        ``edge_mass`` (posterior mass in the outermost grid cells: should be ≈ 0).
    """
    values, idx = _observed(observed_locs, "observed_locs")
    values = values.astype(np.float64)
    T, y = values.shape[0], values[idx].astype(np.float64)
    C = np.minimum.outer(np.arange(T), np.arange(T)) + 1.0  # unit-innovation random walk
    Cy = C[np.ix_(idx, idx)]
    lam, Q = np.linalg.eigh(Cy)
    r = Q.T @ y
    B = C[:, idx] @ Q
    u = np.linspace(*log_scale_range, num_grid)
    du = u[1] - u[0]
    s_inn2 = np.exp(2 * u)[:, None, None]
    s_obs2 = np.exp(2 * u)[None, :, None]
    denom = s_inn2 * lam + s_obs2  # eigenvalues of the observations' covariance
    log_lik = -0.5 * (r**2 / denom).sum(-1) - 0.5 * np.log(denom).sum(-1) - 0.5 * y.size * np.log(2 * np.pi)
    log_prior_u = -0.5 * (u / 2.0) ** 2 - np.log(2.0 * np.sqrt(2 * np.pi))  # N(log s; 0, 2) on log s
    log_post = log_lik + log_prior_u[:, None] + log_prior_u[None, :]
    top = log_post.max()
    w = np.exp(log_post - top)
    log_z = float(top + np.log(w.sum() * du * du))
    w /= w.sum()
    cond_mean = s_inn2 * np.einsum("tk,ijk->ijt", B, r / denom)
    cond_var = s_inn2 * np.diag(C) - s_inn2**2 * np.einsum("tk,ijk->ijt", B**2, 1.0 / denom)
    mean_locs = np.einsum("ij,ijt->t", w, cond_mean)
    var_locs = np.einsum("ij,ijt->t", w, cond_var + cond_mean**2) - mean_locs**2
    s = np.exp(u)
    w_inn, w_obs = w.sum(1), w.sum(0)
    mean = {"innovation_noise_scale": float(w_inn @ s), "observation_noise_scale": float(w_obs @ s), "locs": mean_locs}
    std = {
        "innovation_noise_scale": float(np.sqrt(w_inn @ s**2 - mean["innovation_noise_scale"] ** 2)),
        "observation_noise_scale": float(np.sqrt(w_obs @ s**2 - mean["observation_noise_scale"] ** 2)),
        "locs": np.sqrt(var_locs),
    }
    edge = float(w[0].sum() + w[-1].sum() + w[:, 0].sum() + w[:, -1].sum())
    return {"log_z": log_z, "mean": mean, "std": std, "edge_mass": edge}
