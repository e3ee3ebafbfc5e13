"""Checks on UHA importance weights: PSIS k̂ and the poor-fit warning.

Below both the guides and the evaluation layer: ``UHAGuide.sample_posterior`` and the
estimators warn on the same criteria. ArviZ (``arviz.psislw``) fits the Pareto tail; it is
imported on first use.
"""

from __future__ import annotations

from functools import partial
import math
from typing import NamedTuple
import warnings

import jax
import jax.numpy as jnp
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
#: A k̂ at or above ``KHAT_BAD`` is not taken as a poor fit when no weight is more than
#: e^this (twice) the mean weight, the mean of the log weights standing in for the log
#: of the mean (below it, so the test is stricter): the sample shows no tail at all (its
#: effective sample size is at least half the draws), and the Pareto fit to such nearly
#: equal weights is noise (k̂ = 3.15 at an ESS of 494.9 of 500, log weights within
#: 1.7 nats of each other, for a near-Gaussian posterior fitted by AutoNormal).
BOUNDED_LOG_SPREAD = math.log(2.0)


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
    log_w = _check_log_weights(log_weights, "psis_khat")
    finite = log_w[np.isfinite(log_w)]
    if np.all(finite == finite[0]) and finite.size == log_w.size:
        return -math.inf
    n = log_w.size
    top = _top_count(n)
    # the tail_size(n) + 1 largest, in O(n) (ArviZ sorts all n)
    return _khat_from_largest(np.partition(log_w, n - top)[n - top:], n)


def tail_size(n: int) -> int:
    """M, the number of largest weights PSIS fits its Pareto tail to, for ``n`` independent
    draws (ArviZ's ``psislw`` with r_eff = 1: ⌈min(n/5, 3√n)⌉)."""
    return int(np.ceil(min(n / 5.0, 3 * n ** 0.5)))


def _top_count(n: int) -> int:
    """How many of ``n`` log weights k̂ is fitted from: the ``tail_size(n) + 1`` largest
    (all ``n`` where there are fewer)."""
    return min(tail_size(n) + 1, n)


def _psislw_khat(log_w) -> float:
    import arviz as az

    _, k = az.psislw(np.array(log_w, np.float64), reff=1.0)
    return float(k)


def _khat_from_largest(largest, n) -> float:
    """k̂ of ``n`` log weights (as :func:`psis_khat`; -inf allowed) from their
    ``min(tail_size(n) + 1, n)`` largest, in any order (fewer than ``tail_size(n) + 1``
    weights in all: ``psislw`` on them).

    ArviZ's ``psislw`` fits its generalized Pareto distribution to the weights above
    the (M+1)-th largest (M = :func:`tail_size`), shifted by the largest: those are all
    among the M + 1 largest, so k̂ needs no other weight. The selection below is
    ``psislw``'s (its cutoff, floor and shift); the fit is ArviZ's own ``_gpdfit``, the
    function ``psislw`` calls (where an ArviZ release lacks it, ``psislw`` itself on the
    weights filled out with -inf, which gives the same k̂). tests/test_weight_summary.py checks
    the result equals ``psislw``'s.
    """
    x = np.sort(np.asarray(largest, np.float64))  # ascending
    if x.size != _top_count(n):
        raise ValueError(f"_khat_from_largest: expected {_top_count(n)} values, got {x.size}")
    if x.size < tail_size(n) + 1:
        return _psislw_khat(x)
    try:
        from arviz.stats.stats import _gpdfit
    except ImportError:  # pragma: no cover - an ArviZ without it
        return _psislw_khat(np.concatenate([np.full(n - x.size, -np.inf), x]))
    x = x - x[-1]
    cutoff = max(x[0], np.log(np.finfo(float).tiny))
    tail = x[x > cutoff]
    if tail.size <= 4:  # psislw's: too few for the fit
        return math.inf
    k, _ = _gpdfit(np.exp(tail) - np.exp(cutoff))
    return float(k)


#: about the bytes of temporaries :func:`psis_khat_columns` takes at a time (it fits its
#: columns in chunks of this size)
KHAT_COLUMNS_BYTES = 64 * 2**20


def psis_khat_columns(log_weights) -> np.ndarray:
    """:func:`psis_khat` of each column of ``log_weights`` (``num_draws, num_columns``):
    one k̂ per column, equal to ``psis_khat`` of that column to rounding (NumPy sums in
    another order: 1e-15 relative), in one vectorized generalized Pareto fit over the
    columns (:func:`_gpdfit_rows`; 0.07 ms a column of 1000 draws, psis_khat 3-6 ms).

    -inf is a zero weight; NaN, +inf, a column of -inf only and no draws raise
    ``psis_khat``'s errors (of the first such column). A column whose fit goes off the
    finite numbers (tail weights within rounding of the cutoff) and every column when
    there are too few draws for the tail (``psislw`` on all of them) go through
    ``psis_khat`` itself, with its warnings; the others give none (``_gpdfit``'s
    "overflow encountered in exp", of candidates with negligible weights, is not
    repeated).
    """
    lw = np.asarray(log_weights, np.float64)
    if lw.ndim != 2:
        raise ValueError(
            f"psis_khat_columns: log_weights must be 2-D (draws, columns), got shape {lw.shape}."
        )
    n, num_columns = lw.shape
    if num_columns == 0:
        return np.empty(0)
    bad = np.isnan(lw).any(axis=0) | (lw == np.inf).any(axis=0) | ~np.isfinite(lw).any(axis=0)
    if bad.any():
        _check_log_weights(lw[:, int(np.argmax(bad))], "psis_khat")  # raises
    top = _top_count(n)
    if top < tail_size(n) + 1:  # a handful of draws: psislw's fit on all of them
        return np.array([psis_khat(lw[:, j]) for j in range(num_columns)], np.float64)
    m = _num_thetas(top)
    # a column's partition and sorted top, and the fit's (theta, weight) products twice
    per_column = 8 * (2 * n + 2 * top + 3 * m * top + 3 * m * m)
    chunk = max(1, KHAT_COLUMNS_BYTES // per_column)
    khat = np.empty(num_columns)
    for start in range(0, num_columns, chunk):
        khat[start:start + chunk] = _khat_of_columns(lw[:, start:start + chunk], top)
    return khat


def _khat_of_columns(lw, top) -> np.ndarray:
    """:func:`psis_khat_columns` of a chunk of checked columns (``n ≥ tail_size(n) + 1``
    draws): :func:`_khat_from_largest`'s selection, column by column in arrays, then
    :func:`_gpdfit_rows` on the columns with the same tail length together."""
    n, num_columns = lw.shape
    khat = np.full(num_columns, np.inf)  # psislw's: a tail of 4 weights or fewer
    # psis_khat's no-tail case: every weight finite and equal (the largest is finite)
    equal = lw.min(axis=0) == lw.max(axis=0)
    x = np.partition(lw.T, n - top, axis=1)[:, n - top:]
    x.sort(axis=1)
    x -= x[:, -1:]
    cutoff = np.maximum(x[:, 0], np.log(np.finfo(float).tiny))
    # the tail (the weights above the cutoff) is a suffix of each sorted row
    length = np.sum(x > cutoff[:, None], axis=1)
    fit = ~equal & (length > 4)
    for size in np.unique(length[fit]):
        rows = np.flatnonzero(fit & (length == size))
        with np.errstate(all="ignore"):  # the columns where it matters are redone below
            ary = np.exp(x[rows, top - size:]) - np.exp(cutoff[rows])[:, None]
            k, ok = _gpdfit_rows(ary)
        khat[rows] = k
        for j in rows[~ok]:  # the fit left the finite numbers: ArviZ's, warnings and all
            khat[j] = psis_khat(lw[:, j])
    khat[equal] = -np.inf
    return khat


def _num_thetas(size: int) -> int:
    """How many candidate thetas the fit to ``size`` tail weights weighs (ArviZ's
    ``_gpdfit``: 30 + ⌊√n⌋, where Zhang and Stephens suggest 20 + ⌊√n⌋)."""
    return 30 + int(size ** 0.5)


def _gpdfit_rows(ary):
    """ArviZ's ``_gpdfit`` (its k) of each row of ``ary`` (``rows, n``; each sorted
    ascending, positive, n ≥ 5) at once: Zhang and Stephens' (2009) empirical Bayes fit
    of the generalized Pareto distribution, with ArviZ's weakly informative prior, and
    whether it stayed in the finite numbers (where not, ``_gpdfit`` itself warns, and its
    result may differ: call it). A candidate whose sum of likelihood ratios overflows
    weighs 0 here as there, and both drop it; only ``_gpdfit``'s overflow warning is not
    given.

    The candidates θ_j = 1/x_(n) + (1 − √(m/(j − ½))) / (3 x_(⌊n/4 + ½⌋)), j = 1..m
    (:func:`_num_thetas`); each one's profile log likelihood
    n (log(−θ/k(θ)) − k(θ) − 1), k(θ) = mean log(1 − θ x_i), weighs it (normalized
    over the candidates, those below 10 ε dropped); θ̂ is the weighted mean, k̂ = k(θ̂)
    shrunk towards ½ as by 10 prior draws: (n k̂ + 5) / (n + 10).
    """
    rows, n = ary.shape
    m = _num_thetas(n)
    theta = 1 - np.sqrt(m / (np.arange(1, m + 1, dtype=float) - 0.5))
    quartile = ary[:, int(n / 4 + 0.5) - 1]
    theta = theta / (3 * quartile[:, None]) + 1 / ary[:, -1:]  # (rows, m)
    k = np.log1p(-theta[:, :, None] * ary[:, None, :]).mean(axis=2)
    len_scale = n * (np.log(-(theta / k)) - k - 1)
    # (a sum that overflows: a weight of 0, dropped below as in _gpdfit)
    weights = 1 / np.exp(len_scale[:, None, :] - len_scale[:, :, None]).sum(axis=2)
    weights = np.where(weights >= 10 * np.finfo(float).eps, weights, 0.0)  # negligible
    weights /= weights.sum(axis=1, keepdims=True)
    theta_hat = np.sum(theta * weights, axis=1)
    k_hat = np.log1p(-theta_hat[:, None] * ary).mean(axis=1)
    k_hat = (n * k_hat + 10 * 0.5) / (n + 10)  # the prior: 10 draws at k = 1/2
    ok = (quartile > 0) & np.isfinite(len_scale).all(axis=1) & np.isfinite(k_hat)
    return k_hat, ok


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


#: What the poor-fit warning suggests for UHAGuide's fits.
UHA_ADVICE = (
    "Train longer, use a larger K, or a smaller learning rate (and max_step_size if draws "
    "diverge)."
)
#: ... and for any other guide (AutoNormal has no K or step size).
GUIDE_ADVICE = (
    "Train longer, use a smaller learning rate, or a guide closer to the posterior (e.g. "
    "UHAGuide)."
)


def _warn_if_poor_fit(
    log_weights, where, *, stacklevel=3, khat=None, also="", advice=UHA_ADVICE
):
    """Emit :class:`~numpyro_uha.UHAFitWarning` when the weights say the fit is poor.

    Fires when Pareto k̂ ≥ ``KHAT_BAD`` (0.7; an ``inf`` k̂ from too few draws does not
    count), when the ELBO's standard error over the finite draws exceeds
    ``ELBO_SE_BAD`` (1 nat), or when more than 10 % of the draws diverged. NaN and -inf
    log weights are zero weights. ``also`` is a sentence added to the message (what
    the poor fit means for the caller's result); ``advice`` what to do (UHAGuide's by
    default, :data:`GUIDE_ADVICE` for other guides). Returns k̂.
    """
    log_w = np.asarray(log_weights, dtype=np.float64).ravel()
    finite = np.isfinite(log_w)
    if log_w.size < 2 or np.sum(finite) < 2 or np.any(log_w == np.inf):
        return khat
    if khat is None:
        khat = psis_khat(np.where(finite, log_w, -np.inf))
    se = float(np.std(log_w[finite], ddof=1) / math.sqrt(np.sum(finite)))
    spread = log_spread(log_w)
    _warn_poor_fit(
        khat, se, int(np.sum(finite)), log_w.size, where, stacklevel + 1, also, advice,
        spread=spread,
    )
    return khat


def log_spread(log_w):
    """The largest finite log weight less the finite ones' mean (``None`` where none is
    finite): the ``spread`` of :func:`khat_counts`."""
    log_w = np.asarray(log_w, np.float64)
    finite = log_w[np.isfinite(log_w)]
    return float(np.max(finite) - np.mean(finite)) if finite.size else None


def khat_counts(khat, num_finite, size, spread):
    """Whether k̂ says the fit is poor: k̂ ≥ ``KHAT_BAD`` (finite), unless every draw is
    finite and the largest log weight lies within :data:`BOUNDED_LOG_SPREAD` of their
    mean (``spread``; ``None`` or NaN where unknown). A ``bool`` for one set of weights;
    element by element (a boolean array) where the arguments are arrays, one entry per
    set (``UHALocalGuide.log_z``'s data points)."""
    spread = np.asarray(np.nan if spread is None else spread, np.float64)
    bounded = (np.asarray(num_finite) == size) & (spread <= BOUNDED_LOG_SPREAD)
    khat = np.asarray(khat, np.float64)
    counts = np.isfinite(khat) & (khat >= KHAT_BAD) & ~bounded
    return bool(counts) if counts.ndim == 0 else counts


def _warn_poor_fit(
    khat, se, num_finite, size, where, stacklevel, also="", advice=UHA_ADVICE, *, spread=None
):
    """:func:`_warn_if_poor_fit`'s criteria and warning, from k̂, the ELBO's standard
    error, the count of finite draws among ``size`` and ``spread``, the largest finite
    log weight less their mean (see :func:`khat_counts`)."""
    num_bad = int(size - num_finite)
    problems = []
    if khat_counts(khat, num_finite, size, spread):
        problems.append(
            f"Pareto k̂ = {khat:.2f} ≥ {KHAT_BAD} (importance-weighted estimates and "
            "resampled draws are unreliable)"
        )
    if se > ELBO_SE_BAD:
        problems.append(
            f"the ELBO's Monte Carlo standard error is {se:.2f} nats > {ELBO_SE_BAD} "
            f"(std of log w {se * math.sqrt(num_finite):.1f} nats)"
        )
    if num_bad > 0.1 * size:
        problems.append(f"{num_bad} of {size} draws diverged (> 10 %)")
    if problems:
        warnings.warn(
            f"{where}: the importance weights say the approximation is poor: "
            + "; ".join(problems)
            + "."
            + (f" {also}" if also else "")
            + f" {advice}",
            UHAFitWarning,
            stacklevel=stacklevel,
        )


class WeightSummary(NamedTuple):
    """What the draws' checks need of ``n`` log weights, from :func:`weight_summary`."""

    num_finite: int
    mean: float
    var: float
    median: float
    num_below: int
    low: float
    high: float
    largest: np.ndarray
    #: ``(4, d)``: the draws' checks made with the summary (:func:`check_values`), or
    #: ``None`` where they were not
    checks: np.ndarray | None = None
    #: k̂ fitted on the device in the weights' dtype (:func:`khat_values`; NaN where it
    #: was not, or where the host must fit)
    khat: float = math.nan


#: Where the device's k̂ (:func:`khat_values`, float32) is not used but k̂ refitted on
#: the host in float64 (:func:`summary_khat` ``exact=False``): within this much of
#: ``KHAT_BAD`` or of a boundary of k̂'s rounding to two decimals (the warnings print
#: it so), times max(1, |k̂|). On the weights of tests/test_weight_summary.py the
#: device's k̂ differed from the host's by at most 8.4e-6 on a CPU and 1.4e-5 on an
#: H200 (the test allows half of this).
KHAT_DEVICE_MARGIN = 1e-4


def _tail_size_traced(n):
    """:func:`tail_size` of a traced count ``n`` (int32, at most 10^8), in integers:
    min(⌈n/5⌉, ⌈3√n⌉), ⌈3√n⌉ the least c with c² ≥ 9n."""
    c = jnp.ceil(3.0 * jnp.sqrt(n.astype(jnp.float32))).astype(jnp.int32)
    c = jnp.where((c - 1) * (c - 1) >= 9 * n, c - 1, c)
    c = jnp.where(c * c < 9 * n, c + 1, c)
    return jnp.minimum((n + 4) // 5, c)


def khat_values(largest, n):
    """The device side of :func:`summary_khat`: Pareto k̂ of ``n`` (traced) log weights
    from their ``largest`` (descending, at least ``_top_count(n)``; -inf past the finite
    ones), traceable, in the weights' dtype: :func:`_khat_from_largest`'s selection and
    :func:`_gpdfit_rows`' fit with every length masked (the tail's and the candidates'
    counts depend on ``n`` and the weights). ``inf`` where the tail has 4 weights or
    fewer (as ``psislw``); NaN where the host must fit instead: too few weights for
    the tail selection (``psislw`` on all of them), a tail reaching 80 nats below the
    largest (the float64 fit's cutoff and exp differ there from float32's), more than
    10^8 weights, or a fit that left the finite numbers."""
    x = largest.astype(jnp.promote_types(largest.dtype, jnp.float32))
    size = x.shape[0]
    n = jnp.asarray(n, jnp.int32)
    wanted = _tail_size_traced(n) + 1  # the tail size, and the cutoff above it
    top = jnp.minimum(wanted, n)  # _top_count(n)
    index = jnp.arange(size)
    low = x[jnp.clip(top - 1, 0, size - 1)]  # the cutoff: the top-th largest
    shifted = x - x[0]
    # the tail: the weights above the cutoff, compared unshifted (exactly the host's set)
    tail = (index < top - 1) & (x > low)
    t = jnp.sum(tail)
    cutoff = low - x[0]
    ary = jnp.where(tail, jnp.exp(shifted) - jnp.exp(cutoff), 0.0)  # descending
    # the fit (_gpdfit_rows), on the t tail weights: ascending position i is t - 1 - i
    m_max = _num_thetas(size)
    m = 30 + jnp.floor(jnp.sqrt(t.astype(x.dtype))).astype(jnp.int32)
    j = jnp.arange(1, m_max + 1)
    valid = j <= m
    quartile = ary[jnp.clip(t - jnp.floor(t / 4 + 0.5).astype(jnp.int32), 0, size - 1)]
    theta = 1 - jnp.sqrt(m / jnp.where(valid, j - 0.5, 1.0).astype(x.dtype))
    theta = theta / (3 * quartile) + 1 / ary[0]
    tf = jnp.maximum(t, 1).astype(x.dtype)

    def profile(th):  # k(θ) = mean log(1 - θ x) over the tail
        return jnp.sum(jnp.where(tail, jnp.log1p(-th[..., None] * ary), 0.0), axis=-1) / tf

    k = profile(theta)
    len_scale = tf * (jnp.log(-(theta / k)) - k - 1)
    diff = jnp.where(valid[:, None] & valid[None, :], len_scale[None, :] - len_scale[:, None], -jnp.inf)
    weights = jnp.where(valid, 1 / jnp.sum(jnp.exp(diff), axis=1), 0.0)
    weights = jnp.where(weights >= 10 * np.finfo(np.float64).eps, weights, 0.0)
    weights = weights / jnp.sum(weights)
    theta_hat = jnp.sum(jnp.where(valid, theta * weights, 0.0))
    k_hat = profile(theta_hat)
    k_hat = (tf * k_hat + 10 * 0.5) / (tf + 10)
    selected = (top == wanted) & (cutoff > -80.0) & (n <= 10**8)
    fitted = (
        (quartile > 0) & jnp.all(jnp.where(valid, jnp.isfinite(len_scale), True))
        & jnp.isfinite(k_hat)
    )
    return jnp.where(
        selected & (t <= 4), jnp.inf, jnp.where(selected & fitted, k_hat, jnp.nan)
    ).astype(largest.dtype)


def summary_values(
    log_weights, finite, threshold, num_largest, num_valid=None, latent=None, check=True,
):
    """The device side of :func:`weight_summary`, traceable inside a larger program:
    ``num_finite, num_below`` (their bits in the statistics' dtype), ``mean, sd, low,
    high``, ``khat`` and ``*largest`` of the ``finite`` log weights (only the first
    ``num_valid``, a traced count, where given: the rest are padding), ``largest`` the
    ``num_largest`` largest with the others at -inf and ``khat`` the device's fit from
    them (:func:`khat_values`; NaN without ``num_largest``): one array in the log
    weights' dtype (at least float32), one copy to the host (a GPU copies each array on
    its own, a round trip each). With the draws' ``latent`` (``(n, d)``), their
    :func:`check_values` follow ``largest`` (``4 d`` values; zeros where ``check``, a
    traced flag, is false: one program either way, the checks run only where asked
    for)."""
    lw = jnp.ravel(log_weights)
    ok = jnp.ravel(finite)
    if num_valid is not None:
        ok = ok & (jnp.arange(lw.shape[0]) < num_valid)
    num_finite = jnp.sum(ok)
    mean = jnp.sum(jnp.where(ok, lw, 0.0)) / jnp.maximum(num_finite, 1)
    # two passes: a sum of squares would cancel for large log weights in float32; and
    # the sd, not the variance, in units of the largest deviation: the square of a
    # deviation past 1.8e19 (log weights of -1e25 differ by 1e18 in rounding alone)
    # overflows float32; the host squares the sd in float64
    deviation = jnp.where(ok, lw - mean, 0.0)
    scale = jnp.max(jnp.abs(deviation))
    unit = jnp.where(scale > 0, scale, 1.0)
    sd = unit * jnp.sqrt(
        jnp.sum(jnp.square(deviation / unit)) / jnp.maximum(num_finite - 1, 1)
    )
    num_below = jnp.sum(ok & (lw < threshold))
    low = jnp.min(jnp.where(ok, lw, jnp.inf))
    high = jnp.max(jnp.where(ok, lw, -jnp.inf))
    dtype = jnp.promote_types(lw.dtype, jnp.float32)  # room for the counts' bits
    largest = jnp.zeros((0,), dtype)
    khat = jnp.full((1,), jnp.nan, dtype)
    if num_largest:
        largest = jax.lax.top_k(jnp.where(ok, lw, -jnp.inf), num_largest)[0].astype(dtype)
        khat = khat_values(largest, lw.shape[0] if num_valid is None else num_valid)[None]
    # the counts' bits in the statistics' dtype: one array, one copy to the host
    counts = jax.lax.bitcast_convert_type(
        jnp.stack([num_finite, num_below]).astype(_bits(dtype)), dtype
    )
    stats = [counts, jnp.stack([mean, sd, low, high]).astype(dtype), khat, largest]
    if latent is not None:
        z = jnp.reshape(latent, (lw.shape[0], -1))
        checks = jax.lax.cond(
            check,
            lambda: check_values(lw, ok, z).astype(dtype),
            lambda: jnp.zeros((4, z.shape[1]), dtype),
        )
        stats.append(jnp.ravel(checks))
    return jnp.concatenate(stats)


def _bits(dtype):
    """The signed integer dtype of ``dtype``'s width."""
    return np.dtype(f"int{8 * np.dtype(dtype).itemsize}")


_weight_summary = partial(jax.jit, static_argnames=("num_largest",))(summary_values)


def summary_largest(n: int, khat: bool = True) -> int:
    """How many of the largest weights :func:`summary_khat` needs for ``n`` weights (0
    without ``khat``)."""
    return _top_count(n) if khat and n >= 2 else 0


def weight_summary(
    log_weights, finite, *, threshold=-np.inf, khat=False, latent=None, check=True,
    num_valid=None,
):
    """One program on the device and one small copy to the host, instead of
    the ``n`` log weights: the count of ``finite`` draws, the mean, variance (ddof 1),
    minimum and maximum of their log weights, how many lie below ``threshold``, and (with
    ``khat``) the ``tail_size(n) + 1`` largest, from which :func:`summary_khat` gives
    :func:`psis_khat` of the log weights with the non-finite draws' set to -inf; with
    the draws' ``latent``, their :func:`check_values` too (where ``check``).
    Statistics in the log weights' dtype; ``median`` is NaN (not computed).

    ``num_valid``: only the first ``num_valid`` draws count, the rest are padding (passed
    traced, with the largest taken for the padded size: one program per padded size,
    not per ``num_valid``, e.g. for the guide's draws joined from chunks of one width)."""
    size = int(np.size(log_weights))
    n = size if num_valid is None else int(num_valid)
    values = _weight_summary(
        log_weights, finite, np.asarray(threshold, jnp.result_type(log_weights)),
        num_largest=summary_largest(size, khat), latent=latent, check=np.bool_(check),
        num_valid=None if num_valid is None else np.int32(n),
    )
    latent_dim = None if latent is None else int(np.size(latent)) // max(size, 1)
    return summary_from_values(values, n, summary_largest(n, khat), latent_dim)


def summary_from_values(
    values, n: int, num_largest: int, latent_dim: int | None = None,
) -> WeightSummary:
    """The :class:`WeightSummary` of ``n`` weights from :func:`summary_values`' device
    arrays (copied to the host here, the one wait), taken with at least ``num_largest``
    largest (more, where they were taken over a padded batch: its padding is -inf, so the
    first ``num_largest`` are the ``n`` weights' own); ``latent_dim``: the draws' ``d``
    where the values carry their checks (``summary_values(latent=...)``)."""
    # no median: it would take a sort, which XLA:CPU runs 10-20 times slower than NumPy's
    # partition (1M weights: 0.22 s); the warning that prints it takes it from the weights
    stats = np.asarray(jax.device_get(values))
    num_finite, num_below = stats[:2].view(_bits(stats.dtype))
    checks = None
    if latent_dim is not None:
        stats, checks = stats[:stats.size - 4 * latent_dim], stats[stats.size - 4 * latent_dim:]
        checks = np.asarray(checks, np.float64).reshape(4, latent_dim)
    mean, sd, low, high, khat = stats[2:7]
    largest = np.asarray(stats[7:])
    if largest.size < num_largest:
        raise ValueError(f"summary_from_values: {largest.size} largest, {num_largest} needed")
    var = float(sd) ** 2  # in float64: finite where the log weights' dtype overflows
    return WeightSummary(int(num_finite), float(mean), var, math.nan, int(num_below),
                         float(low), float(high), largest[:num_largest], checks, float(khat))


def summary_khat(summary, n, exact=True) -> float:
    """:func:`psis_khat` of ``n`` log weights (non-finite ones as -inf) from their
    :func:`weight_summary` (taken with ``khat=True``). With ``exact=False``, the k̂ the
    device fitted with the summary (float32: within 1.4e-5 of the host's), except where
    it lies within ``KHAT_DEVICE_MARGIN`` of ``KHAT_BAD`` or of a boundary of its
    rounding to two decimals, or where the device left the fit to the host: there the
    float64 fit on the host (0.2 ms), so a verdict or a printed k̂ is the exact one's."""
    if summary.num_finite == n and summary.low == summary.high:
        return -math.inf  # all equal: no tail
    if not exact and _device_khat_decides(summary.khat):
        return summary.khat
    return _khat_from_largest(summary.largest, n)


def _device_khat_decides(khat) -> bool:
    """Whether the device's ``khat`` stands for the host's: inf (too short a tail) or
    finite and clear of ``KHAT_BAD`` and of the rounding boundaries (see
    :func:`summary_khat`)."""
    if khat == math.inf:
        return True
    if not math.isfinite(khat):
        return False
    margin = KHAT_DEVICE_MARGIN * max(1.0, abs(khat))
    hundredths = 100 * khat
    return (
        abs(khat - KHAT_BAD) > margin
        and abs(hundredths - math.floor(hundredths) - 0.5) > 100 * margin
    )


#: the shift of a coordinate's mean by the weights (in sds of the draws) above which the
#: draws are called biased there (with the shift beyond SHIFT_SE_BAD standard errors)
SHIFT_BAD = 0.25
SHIFT_SE_BAD = 4.0


#: the ratio of a coordinate's importance-weighted sd to the draws' own sd beyond which
#: (above 1 + SPREAD_BAD, or below 1 / (1 + SPREAD_BAD); its log beyond SHIFT_SE_BAD
#: standard errors) the draws are called too narrow (too wide) there
SPREAD_BAD = 0.25


def _normalized(log_weights, finite, latent, xp):
    """The draws ``z`` (``(n, d)``, less the first finite draw; non-finite rows at 0), the
    count of finite draws (at least 2), the self-normalized weights ``w`` and the plain
    ones ``u`` (1/n), both 0 at the non-finite draws."""
    lw = xp.ravel(log_weights)
    ok = xp.ravel(finite)
    z = xp.reshape(latent, (lw.shape[0], -1))
    # every statistic here is unchanged by a shift of a coordinate: shifted by the first
    # finite draw, float32 sums of a coordinate far from 0 against its sd (1000 ± 0.01)
    # keep their precision (unshifted, 10 000 draws' means came out a whole sd apart;
    # the difference of two float32 draws within a factor 2 of each other is exact)
    z = xp.where(ok[:, None], z - z[xp.argmax(ok)], 0.0)
    n = xp.maximum(xp.sum(ok), 2)
    lw = xp.where(ok, lw, -xp.inf)
    w = xp.exp(lw - xp.max(lw))
    w = w / xp.sum(w)
    u = xp.where(ok, 1.0, 0.0) / n
    return z, ok, n, w, u


def weighted_shift(log_weights, finite, latent, xp=jnp):
    """Per latent coordinate, ``(shift, se)``: the self-normalized importance-weighted
    mean of the ``finite`` draws minus their plain mean, in units of the draws' sd, and
    its Monte Carlo standard error (by the delta method: the two means' influence
    functions w̃_i (z_i − weighted mean) and (z_i − plain mean) / n differ draw by draw,
    and the difference's variance is the sum of their squares), in the same sd units: the
    significance of the difference (the sd, itself random, is only the scale). NaN where
    a coordinate does not vary. By Cauchy–Schwarz ``|shift| ≤ sqrt(n / ESS − 1)``.
    ``xp``: ``jax.numpy`` (traceable) or ``numpy``."""
    z, ok, n, w, u = _normalized(log_weights, finite, latent, xp)
    plain = u @ z
    sd = xp.sqrt(u @ xp.square(z - plain) * n / (n - 1))
    weighted = w @ z
    shift = (weighted - plain) / sd
    # the two means' influence functions, draw by draw (delta method): their difference's
    # variance is the sum of squares of the draws' differences
    influence = w[:, None] * (z - weighted) - u[:, None] * (z - plain)
    se = xp.sqrt(xp.sum(xp.square(xp.where(ok[:, None], influence, 0.0)), axis=0)) / sd
    return shift, se


def weighted_spread(log_weights, finite, latent, xp=jnp):
    """Per latent coordinate, ``(log_ratio, se)``: the log of the self-normalized
    importance-weighted sd of the ``finite`` draws over their plain sd (both without
    Bessel's correction: equal weights give exactly 0), and its Monte Carlo standard
    error by the delta method, as :func:`weighted_shift`'s: the influence functions of
    the two log variances, w̃_i ((z_i − m̃)² − ṽ) / ṽ and ((z_i − m)² − v) / (n v), differ
    draw by draw, the difference's variance is the sum of their squares, and the log sd
    ratio is half the log variance ratio. Above 0 the draws are narrower than the
    posterior the weights estimate (a Gaussian q's classic failure, along correlated
    coordinates); NaN where a coordinate does not vary."""
    z, ok, n, w, u = _normalized(log_weights, finite, latent, xp)
    plain = u @ z
    weighted = w @ z
    plain_var = u @ xp.square(z - plain)
    weighted_var = w @ xp.square(z - weighted)
    influence = (
        w[:, None] * (xp.square(z - weighted) / weighted_var - 1.0)
        - u[:, None] * (xp.square(z - plain) / plain_var - 1.0)
    )
    se = 0.5 * xp.sqrt(xp.sum(xp.square(xp.where(ok[:, None], influence, 0.0)), axis=0))
    return 0.5 * xp.log(weighted_var / plain_var), se


def check_values(log_weights, finite, latent, xp=jnp):
    """``(4, d)``: :func:`weighted_shift`'s ``shift, se`` and :func:`weighted_spread`'s
    ``log_ratio, se`` of the same draws, stacked: what :func:`flag_checks` reads.
    Traceable (made beside the weight summary in the draws' own program, see
    :func:`summary_values`), or in NumPy with ``xp=numpy``."""
    return xp.stack([
        *weighted_shift(log_weights, finite, latent, xp=xp),
        *weighted_spread(log_weights, finite, latent, xp=xp),
    ])


_check_values = jax.jit(check_values)


def flag_checks(checks):
    """From :func:`check_values` (host arrays), ``(shift, se, biased)`` and
    ``(log_ratio, se, misspread)``: the coordinates whose mean the weights move by more
    than ``SHIFT_BAD`` sds, and those whose sd they widen or narrow by more than a factor
    ``1 + SPREAD_BAD``, each beyond ``SHIFT_SE_BAD`` standard errors: there the
    unweighted draws are off the weighted (self-normalized) estimate by more than its
    noise (biased; too narrow or too wide). NaN (a coordinate that does not vary) is
    never flagged."""
    shift, shift_se, log_ratio, ratio_se = np.asarray(checks, np.float64)
    with np.errstate(invalid="ignore"):
        biased = (np.abs(shift) > SHIFT_BAD) & (np.abs(shift) > SHIFT_SE_BAD * shift_se)
        misspread = (np.abs(log_ratio) > math.log1p(SPREAD_BAD)) & (
            np.abs(log_ratio) > SHIFT_SE_BAD * ratio_se
        )
    return (shift, shift_se, np.flatnonzero(biased)), (
        log_ratio, ratio_se, np.flatnonzero(misspread)
    )


def draw_checks(log_weights, finite, latent):
    """:func:`flag_checks` of the draws' :func:`check_values`, in one program on their
    device (the guide's draws make them beside their weight summary instead)."""
    return flag_checks(jax.device_get(_check_values(log_weights, finite, latent)))
