"""Checks on UHA importance weights: PSIS k̂ and the poor-fit warning.

Below both the guides and the evaluation layer: ``UHAGuide.sample_posterior`` and the
estimators warn on the same criteria. ArviZ (``arviz.psislw``) fits the Pareto tail; it is
imported on first use.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from numpyro_uha._divergence import UHAFitWarning

#: Pareto k̂ below this: importance sampling estimates are reliable (finite variance).
KHAT_GOOD = 0.5
#: Pareto k̂ at or above this: importance-weighted estimates should not be trusted.
KHAT_BAD = 0.7
#: ELBO Monte Carlo standard error (nats) above which :class:`~numpyro_uha.UHAFitWarning`
#: is emitted. log Z (and ELBO) differences of about 1 nat are where evidence between
#: models starts to count (a Bayes factor of e, Kass & Raftery's "positive" evidence);
#: an ELBO uncertain by more than that cannot resolve them, and std(log w) = SE · √N that
#: large (31 nats at N = 1000) means the weights vary over many orders of magnitude.
ELBO_SE_BAD = 1.0


def _check_log_weights(log_weights, where) -> np.ndarray:
    """``log_weights`` as a flat float64 array; NaN and +inf raise, -inf is a zero weight."""
    log_w = np.asarray(log_weights, dtype=np.float64).ravel()
    if log_w.size == 0:
        raise ValueError(f"{where}: log_weights is empty.")
    bad = int(np.sum(np.isnan(log_w) | (log_w == np.inf)))
    if bad:
        raise FloatingPointError(
            f"{where}: {bad} of {log_w.size} log weights are NaN or +inf (diverged draws); "
            "the weights are meaningless. Retrain with a smaller step size or learning rate."
        )
    if not np.any(np.isfinite(log_w)):
        raise FloatingPointError(
            f"{where}: all {log_w.size} log weights are -inf (every draw has zero weight)."
        )
    return log_w


def psis_khat(log_weights) -> float:
    """Pareto k̂ of the importance weights (PSIS, Vehtari et al. 2024).

    k̂ estimates the shape of the weights' right tail, fitted by a generalized Pareto
    distribution; the weights have finite moments of order below 1/k̂. Thresholds
    (see :func:`khat_verdict`):

    - k̂ < 0.5 (``KHAT_GOOD``): good; the weights' variance is finite and importance
      sampling estimates converge at the usual rate.
    - 0.5 ≤ k̂ < 0.7: OK; estimates are usable but converge more slowly.
    - k̂ ≥ 0.7 (``KHAT_BAD``): unreliable; importance-weighted estimates (weighted
      moments, resampling) and the importance-weighted log Z bound should not be
      trusted. The proposal misses part of the posterior.

    UHA draws are independent, so no MCMC efficiency correction is applied (r_eff = 1).

    Args:
        log_weights: log importance weights, any shape (flattened); -inf is a zero
            weight.

    Returns:
        float: k̂. It is ``inf`` when there are too few draws for the tail fit (ArviZ
        needs more than 4 draws in the tail, about 25 draws in all), and ``-inf`` when
        all weights are equal (no tail at all; a perfect proposal).

    Raises:
        FloatingPointError: if a log weight is NaN or +inf, or all are -inf.
        ValueError: if ``log_weights`` is empty.
    """
    import arviz as az

    log_w = _check_log_weights(log_weights, "psis_khat")
    finite = log_w[np.isfinite(log_w)]
    if np.all(finite == finite[0]) and finite.size == log_w.size:
        return -math.inf
    _, k = az.psislw(log_w.copy(), reff=1.0)
    return float(k)


def khat_verdict(k) -> str:
    """Classify a Pareto k̂ as ``"good"``, ``"ok"`` or ``"bad"``.

    Args:
        k: a Pareto k̂, e.g. from :func:`psis_khat`.

    Returns:
        str: ``"good"`` if k̂ < ``KHAT_GOOD`` (0.5), ``"ok"`` if k̂ < ``KHAT_BAD``
        (0.7), otherwise ``"bad"`` (including ``inf``).

    Raises:
        ValueError: if ``k`` is not a real number or is NaN.
    """
    if isinstance(k, (bool, str, bytes)) or np.ndim(k) != 0:
        raise ValueError(f"khat_verdict: k must be a real number, got {k!r}.")
    k = float(k)
    if math.isnan(k):
        raise ValueError("khat_verdict: k is NaN.")
    if k < KHAT_GOOD:
        return "good"
    if k < KHAT_BAD:
        return "ok"
    return "bad"


def _warn_if_poor_fit(log_weights, where, *, stacklevel=3, khat=None, also=""):
    """Emit :class:`~numpyro_uha.UHAFitWarning` when the weights say the fit is poor.

    Fires when Pareto k̂ ≥ ``KHAT_BAD`` (0.7; an ``inf`` k̂ from too few draws does not
    count), when the ELBO's standard error over the finite draws exceeds
    ``ELBO_SE_BAD`` (1 nat), or when more than 10 % of the draws diverged. NaN and -inf
    log weights are zero weights. ``also`` is a sentence added to the message (what
    the poor fit means for the caller's result). Returns k̂.
    """
    log_w = np.asarray(log_weights, dtype=np.float64).ravel()
    finite = np.isfinite(log_w)
    if log_w.size < 2 or np.sum(finite) < 2 or np.any(log_w == np.inf):
        return khat
    if khat is None:
        khat = psis_khat(np.where(finite, log_w, -np.inf))
    se = float(np.std(log_w[finite], ddof=1) / math.sqrt(np.sum(finite)))
    num_bad = int(log_w.size - np.sum(finite))
    problems = []
    if math.isfinite(khat) and khat >= KHAT_BAD:
        problems.append(
            f"Pareto k̂ = {khat:.2f} ≥ {KHAT_BAD} (importance-weighted estimates and "
            "resampled draws are unreliable)"
        )
    if se > ELBO_SE_BAD:
        problems.append(
            f"the ELBO's Monte Carlo standard error is {se:.2f} nats > {ELBO_SE_BAD} "
            f"(std of log w {se * math.sqrt(np.sum(finite)):.1f} nats)"
        )
    if num_bad > 0.1 * log_w.size:
        problems.append(f"{num_bad} of {log_w.size} draws diverged (> 10 %)")
    if problems:
        warnings.warn(
            f"{where}: the importance weights say the approximation is poor: "
            + "; ".join(problems)
            + "."
            + (f" {also}" if also else "")
            + " Train longer, use a larger K, or a smaller learning rate (and "
            "max_step_size if draws diverge).",
            UHAFitWarning,
            stacklevel=stacklevel,
        )
    return khat
