"""The model with a closed-form posterior shared by ``test_arviz_export.py`` and
``test_nuts_comparison.py``: a conjugate 2-vector mean ``mu``, a positive ``tau`` that the
likelihood ignores (its posterior is its LogNormal(0, TAU_S) prior) and a deterministic
site, with a UHAGuide (K=4) fitted briefly to it."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from numpyro.infer import SVI, Trace_ELBO

from numpyro_uha import UHAGuide
from numpyro_uha.guide import _marginal_std

PRIOR_SD, NOISE_SD, N_OBS = 3.0, 1.0, 20
Y = jnp.array([1.0, -0.5]) + NOISE_SD * jax.random.normal(jax.random.PRNGKey(1), (N_OBS, 2))
TAU_S = 0.5  # tau ~ LogNormal(0, TAU_S)


def model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, PRIOR_SD).expand([2]).to_event(1))
    tau = numpyro.sample("tau", dist.LogNormal(0.0, TAU_S))
    numpyro.deterministic("shift", mu + tau)
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, NOISE_SD).to_event(1), obs=y)


def exact_moments():
    """Closed-form posterior means, sds (per scalar: mu[0], mu[1], tau) and covariance."""
    precision = 1.0 / PRIOR_SD**2 + N_OBS / NOISE_SD**2
    mu_mean = np.asarray(Y.sum(0), np.float64) / NOISE_SD**2 / precision
    tau_mean = math.exp(TAU_S**2 / 2)
    tau_sd = math.sqrt((math.exp(TAU_S**2) - 1) * math.exp(TAU_S**2))
    mean = np.array([mu_mean[0], mu_mean[1], tau_mean])
    sd = np.array([precision**-0.5, precision**-0.5, tau_sd])
    return mean, sd, np.diag(sd**2)


def exact_draws(n, seed):
    """n exact posterior draws of mu and tau."""
    rng = np.random.default_rng(seed)
    mean, sd, _ = exact_moments()
    mu = mean[:2] + sd[:2] * rng.standard_normal((n, 2))
    tau = np.exp(TAU_S * rng.standard_normal(n))
    return {"mu": mu, "tau": tau}


def fit_guide():
    """(guide, params): UHAGuide(K=4) after a 200-step warm start and 300 SVI steps."""
    guide = UHAGuide(model, K=4, warm_start_steps=200, warm_start_learning_rate=0.05)
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    result = svi.run(jax.random.PRNGKey(0), 300, Y, progress_bar=False)
    return guide, result.params


def mean_moved(params):
    """Fitted params with q's mean of mu[0] moved 0.6 of its sd: K = 4 steps bring the
    draws only part of the way back, so the draws' mean check speaks."""
    sd = _marginal_std(params["auto_scale_tril"])
    return dict(params, auto_loc=params["auto_loc"].at[0].add(0.6 * sd[0]))


def narrow_and_wide(params):
    """Fitted params with q's sd of mu[0] shrunk to 0.6 and mu[1]'s widened 1.6-fold."""
    scale_tril = params["auto_scale_tril"]
    return dict(params, auto_scale_tril=scale_tril.at[0].multiply(0.6).at[1].multiply(1.6))
