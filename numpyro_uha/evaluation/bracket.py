"""A log Z bracket from posterior draws alone, independent of any trained guide.

A full-rank Gaussian q̂ is fitted to (approximately exact) posterior draws, e.g. from a
long NUTS run. Then

* the importance-weighted estimate log (1/N) Σ p̄(z_i)/q̂(z_i), z_i ~ q̂, is a stochastic
  *lower* bound on log Z (its expectation is ≤ log Z, by Jensen);
* the EUBO, the mean over the posterior draws of log p̄(z) − log q̂(z), is an *upper*
  bound: for exact posterior draws E_p[log p̄ − log q̂] = log Z + KL(p ‖ q̂) ≥ log Z,
  provided q̂ does not depend on the draws it is averaged over. So the draws are split in
  halves and each half is scored under the Gaussian fitted to the other (scored in-sample,
  the EUBO is biased low by about (d + d(d+1)/2) / (2N) and can cross the lower end).

Unlike :func:`~numpyro_uha.evaluation.sandwich`, whose upper end runs the guide's
annealing backwards from the posterior draws, nothing here depends on the guide: the
bracket stays informative when the guide is far from the posterior — which is exactly when
a user needs to know it. It is tight when the posterior is close to Gaussian in the
unconstrained space, and loose (but still valid) otherwise.

**Assumption** for the upper end: the draws are exact posterior draws. With draws from a
sampler stuck in one mode of a multimodal posterior, the "upper" end can fall below log Z.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_uha.evaluation.arviz import _check_positive_int

__all__ = ["LogZBracket", "log_z_bracket", "log_z_bracket_from_draws"]


class LogZBracket(NamedTuple):
    """Lower and upper ends of log Z from a Gaussian q̂ fitted to posterior draws.

    Attributes:
        lower: importance-weighted estimate over ``num_q_draws`` draws from q̂ (a lower
            bound in expectation).
        lower_se: its delta-method standard error.
        upper: EUBO, the mean of log p̄ − log q̂ over the posterior draws (an upper bound
            if they are exact posterior draws), cross-fitted: each half of every chain
            is scored under the Gaussian fitted to the other halves, so that q̂ is
            independent of the draws it is scored on.
        upper_se: its standard error, from the effective sample size of the draws'
            log ratios (chains given by ``num_chains``).
        q_elbo: the ELBO of q̂ (≤ ``lower`` in expectation).
        q_elbo_se: its standard error.
        q_ess: effective sample size of the importance weights of the draws from q̂.
        num_q_draws: draws from q̂.
        num_posterior_draws: posterior draws used.
        upper_ess: effective sample size behind ``upper_se``.
    """

    lower: float
    lower_se: float
    upper: float
    upper_se: float
    q_elbo: float
    q_elbo_se: float
    q_ess: float
    num_q_draws: int
    num_posterior_draws: int
    upper_ess: float

    @property
    def width(self) -> float:
        """``upper - lower`` (≥ 0 in expectation)."""
        return self.upper - self.lower

    def __str__(self) -> str:
        return (
            f"log Z in [{self.lower:.4f} ± {self.lower_se:.4f}, {self.upper:.4f} ± "
            f"{self.upper_se:.4f}] (Gaussian fitted to {self.num_posterior_draws} posterior "
            f"draws: IW over {self.num_q_draws} draws, ESS {self.q_ess:.0f}; EUBO); "
            f"ELBO of the Gaussian {self.q_elbo:.4f} ± {self.q_elbo_se:.4f}"
        )


def log_z_bracket_from_draws(
    rng_key,
    logdensity_fn: Callable,
    posterior_positions,
    *,
    num_chains: int = 1,
    num_q_draws: int = 100_000,
    batch_size: int = 10_000,
) -> LogZBracket:
    """[lower, upper] ends of log Z from posterior draws of a log density (module docstring).

    Args:
        rng_key: JAX random key for the draws from q̂.
        logdensity_fn: ``z -> log p̄(z)`` over a flat vector ``z``.
        posterior_positions: posterior draws, shape ``(N, d)`` in the space of
            ``logdensity_fn``; with ``num_chains > 1`` the rows are ``num_chains``
            consecutive chains of equal length (as ``mcmc.get_samples()`` concatenates
            them).
        num_chains: number of chains the rows come from (for the effective sample size).
        num_q_draws: draws from q̂ for the lower end.
        batch_size: draws from q̂ evaluated together.

    Raises:
        ValueError: on a bad shape, too few draws, non-finite positions, or counts that
            are not positive integers.
        FloatingPointError: if the log density is NaN or infinite at a draw.
    """
    from numpyro.diagnostics import effective_sample_size

    positions = np.asarray(posterior_positions, np.float64)
    if positions.ndim != 2:
        raise ValueError(f"posterior_positions must have shape (N, d), got {positions.shape}.")
    num_chains = _check_positive_int("num_chains", num_chains)
    num_q_draws = _check_positive_int("num_q_draws", num_q_draws, minimum=2)
    batch_size = _check_positive_int("batch_size", batch_size)
    n, dim = positions.shape
    if n % num_chains or n // num_chains < 4:
        raise ValueError(
            f"posterior_positions has {n} rows, which cannot be split into num_chains="
            f"{num_chains} chains of at least 4 draws each."
        )
    if n // num_chains // 2 * num_chains <= dim:
        raise ValueError(
            f"posterior_positions has {n} draws of a {dim}-dimensional latent: the upper end "
            "fits a full-rank Gaussian to half of them, which needs more draws than "
            "dimensions in each half (thousands, in practice)."
        )
    if not np.all(np.isfinite(positions)):
        raise ValueError("posterior_positions contain NaN or inf values.")

    dtype = jnp.result_type(float)

    def fit(x):
        """(mean, Cholesky factor, log normalizer) of the Gaussian fitted to the rows of x."""
        cov = np.atleast_2d(np.cov(x, rowvar=False))
        chol_np = np.linalg.cholesky(cov + 1e-9 * np.trace(cov) / dim * np.eye(dim))
        log_norm = -np.sum(np.log(np.diag(chol_np))) - 0.5 * dim * math.log(2 * math.pi)
        return jnp.asarray(x.mean(0), dtype), jnp.asarray(chol_np, dtype), jnp.asarray(log_norm, dtype)

    @jax.jit
    def log_ratio(z, gaussian):
        mean, chol, log_norm = gaussian
        r = jax.scipy.linalg.solve_triangular(chol, (z - mean).T, lower=True)
        return jax.vmap(logdensity_fn)(z) - (-0.5 * jnp.sum(r**2, 0) + log_norm)

    @partial(jax.jit, static_argnums=1)
    def draw(key, num, gaussian):
        mean, chol, _ = gaussian
        return mean + jax.random.normal(key, (num, dim), dtype) @ chol.T

    def evaluate(z_batches, gaussian):
        out = np.concatenate([np.asarray(log_ratio(z, gaussian), np.float64) for z in z_batches])
        if not np.all(np.isfinite(out)):
            raise FloatingPointError(
                "log_z_bracket: the log density is NaN or infinite at "
                f"{int(np.sum(~np.isfinite(out)))} draw(s)."
            )
        return out

    def at(x, gaussian):
        return evaluate(
            (jnp.asarray(x[i : i + batch_size], dtype) for i in range(0, len(x), batch_size)), gaussian
        )

    # Upper end: the EUBO, cross-fitted. A Gaussian fitted to the same draws it is scored
    # on sits closer to them than to fresh posterior draws and biases the EUBO low (by
    # about (number of Gaussian parameters) / (2 N), enough to cross the lower end with a
    # few hundred draws). So each chain is cut into halves, the Gaussian fitted to the
    # first halves scores the second halves and vice versa.
    chains = positions.reshape(num_chains, n // num_chains, dim)
    half = n // num_chains // 2
    first, second = chains[:, :half], chains[:, half : 2 * half]
    scored = [
        at(second.reshape(-1, dim), fit(first.reshape(-1, dim))).reshape(num_chains, half),
        at(first.reshape(-1, dim), fit(second.reshape(-1, dim))).reshape(num_chains, half),
    ]
    at_posterior = np.concatenate(scored, axis=0)  # 2 · num_chains sequences
    upper_ess = float(np.asarray(effective_sample_size(at_posterior[..., None]))[0])
    upper_ess = min(max(upper_ess, 1.0), float(at_posterior.size))
    upper = float(at_posterior.mean())
    upper_se = float(at_posterior.std(ddof=1) / math.sqrt(upper_ess))

    # Lower end: importance weights of draws from q̂.
    keys = jax.random.split(rng_key, -(-num_q_draws // batch_size))
    sizes = [min(batch_size, num_q_draws - i * batch_size) for i in range(len(keys))]
    gaussian = fit(positions)
    log_w = evaluate((draw(k, size, gaussian) for k, size in zip(keys, sizes)), gaussian)
    shift = log_w.max()
    w = np.exp(log_w - shift)
    lower = float(shift + math.log(w.mean()))
    lower_se = float(w.std(ddof=1) / math.sqrt(num_q_draws) / w.mean())
    return LogZBracket(
        lower=lower,
        lower_se=lower_se,
        upper=upper,
        upper_se=upper_se,
        q_elbo=float(log_w.mean()),
        q_elbo_se=float(log_w.std(ddof=1) / math.sqrt(num_q_draws)),
        q_ess=float(w.sum() ** 2 / np.sum(w**2)),
        num_q_draws=num_q_draws,
        num_posterior_draws=n,
        upper_ess=upper_ess,
    )


def log_z_bracket(
    guide,
    rng_key,
    params,
    posterior_samples: dict,
    *args,
    num_chains: int = 1,
    num_q_draws: int = 100_000,
    batch_size: int = 10_000,
    **kwargs,
) -> LogZBracket:
    """[lower, upper] ends of the model's log Z from posterior draws, e.g. NUTS'.

    Uses the guide only for the model's log density and its latent layout (the guide's
    parameters play no part), so the bracket is an independent check of the guide's
    bounds: a UHA ELBO far below ``lower`` says the guide has not found the posterior.

    ``posterior_samples`` maps every latent site to constrained values with one leading
    draw dimension (``mcmc.get_samples()``; ``num_chains`` chains concatenated in order).
    See :func:`log_z_bracket_from_draws`.

    Example::

        mcmc = MCMC(NUTS(model), num_warmup=2000, num_samples=5000, num_chains=4)
        mcmc.run(random.PRNGKey(2), *model_args)
        print(log_z_bracket(guide, random.PRNGKey(3), params, mcmc.get_samples(),
                            *model_args, num_chains=4))
    """
    from numpyro_uha.evaluation.estimators import _guide_positions

    logdensity_fn, _, positions = _guide_positions(guide, params, posterior_samples, args, kwargs)
    return log_z_bracket_from_draws(
        rng_key, logdensity_fn, positions,
        num_chains=num_chains, num_q_draws=num_q_draws, batch_size=batch_size,
    )
