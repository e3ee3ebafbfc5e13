"""log Z estimates with standard errors from UHA (or any importance) log weights, and
from the log weights of any NumPyro AutoGuide."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

__all__ = [
    "LogZEstimate", "MinibatchBound", "guide_log_weights", "log_z_from_weights", "minibatch_bound"
]


class LogZEstimate(NamedTuple):
    """Two estimates of log Z from N log weights.

    A draw whose log weight is NaN or -inf (a diverged trajectory, or an endpoint where
    the density is 0) counts as a zero weight: as the energy error of a diverging
    trajectory grows without bound, the momentum-density ratio in its weight, and so the
    weight, goes to 0. The importance-weighted estimate stays a consistent, lower-biased
    estimate of log Z with these zeros; the ELBO (mean log w) of such draws is
    genuinely −∞, so ``elbo`` is reported over the finite draws, and
    ``num_nonfinite`` says how many there were.

    Attributes:
        elbo: mean of log w, a stochastic lower bound on log Z (in expectation); over the
            finite draws when some are not (then it is no longer a bound: the ELBO of
            all draws is −∞).
        elbo_se: its Monte Carlo standard error, std(log w) / sqrt(N) (over the finite
            draws, likewise).
        iw: log (1/N) Σ exp(log w_i), the importance-weighted bound: also a lower bound
            in expectation, tighter than ``elbo``, and consistent for log Z as N grows.
            N counts every draw, the diverged ones as w = 0.
        iw_se: delta-method standard error of ``iw``, std(w) / (sqrt(N) · mean(w)).
            Unreliable when the weights are heavy-tailed (see ``ess``).
        ess: effective sample size of the normalized weights, (Σw)² / Σw².
        num_draws: N, every draw (finite or not).
        num_transitions: K used to produce the weights, if known.
        num_nonfinite: draws whose log weight is NaN or -inf, counted as w = 0.
    """

    elbo: float
    elbo_se: float
    iw: float
    iw_se: float
    ess: float
    num_draws: int
    num_transitions: int | None = None
    num_nonfinite: int = 0

    def __str__(self) -> str:
        k = "" if self.num_transitions is None else f", K={self.num_transitions}"
        over = ""
        diverged = ""
        if self.num_nonfinite:
            over = f" (over the {self.num_draws - self.num_nonfinite} finite draws)"
            diverged = (
                f" | {self.num_nonfinite} of {self.num_draws} draws diverged "
                "(counted as w = 0)"
            )
        return (
            f"ELBO {self.elbo:.4f} ± {self.elbo_se:.4f}{over} | IW log Z {self.iw:.4f} ± "
            f"{self.iw_se:.4f} | ESS {self.ess:.1f} of {self.num_draws}{k}{diverged}"
        )


def log_z_from_weights(log_weights, num_transitions: int | None = None) -> LogZEstimate:
    """Summarize log importance weights as :class:`LogZEstimate`.

    NaN and -inf log weights are zero weights (diverged draws, see
    :class:`LogZEstimate`): ``iw`` is log of the sum of the finite weights over the
    *total* number of draws, ``elbo`` and ``elbo_se`` are over the finite draws, and
    ``num_nonfinite`` counts them.

    Raises:
        FloatingPointError: if a weight is +inf (the estimate would be infinite: a
            density that is unbounded where the draws go), if fewer than two weights are
            finite, or if there are fewer than two draws to estimate a standard error
            from.
    """
    log_w = np.asarray(log_weights, dtype=np.float64).ravel()
    if log_w.size < 2:
        raise FloatingPointError("log_z_from_weights needs at least two log weights.")
    plus_inf = int(np.sum(log_w == np.inf))
    if plus_inf:
        raise FloatingPointError(
            f"{plus_inf} of {log_w.size} log weights are +inf: the estimate would be "
            "infinite. The log density is unbounded (or overflows) where the draws go."
        )
    n = log_w.size
    finite = np.isfinite(log_w)
    num_nonfinite = int(n - np.sum(finite))
    log_w_finite = log_w[finite]
    if log_w_finite.size < 2:
        raise FloatingPointError(
            f"{num_nonfinite} of {n} log weights are NaN or -inf (diverged draws): fewer "
            "than two finite ones are left to estimate log Z from. The sampler diverged; "
            "lower the step size."
        )
    shift = np.max(log_w_finite)
    # Diverged draws are zero weights: they count in N (the mean) but add nothing.
    w = np.zeros(n)
    w[finite] = np.exp(log_w_finite - shift)
    mean_w = np.mean(w)
    return LogZEstimate(
        elbo=float(np.mean(log_w_finite)),
        elbo_se=float(np.std(log_w_finite, ddof=1) / math.sqrt(log_w_finite.size)),
        iw=float(shift + np.log(mean_w)),
        iw_se=float(np.std(w, ddof=1) / (math.sqrt(n) * mean_w)),
        ess=float(np.sum(w) ** 2 / np.sum(w**2)),
        num_draws=n,
        num_transitions=num_transitions,
        num_nonfinite=num_nonfinite,
    )


#: about how many log weights log_z_columns copies at a time (32 MB)
LOG_Z_COLUMNS_CHUNK = 2**22


def log_z_columns(log_w, num_transitions):
    """:func:`log_z_from_weights` of each column of ``log_w``
    (``num_samples, B``, float64), as arrays by field name (``iw``, ``iw_se``,
    ``elbo``, ``elbo_se``, ``ess``, ``num_nonfinite``), and ``spread``, the largest log
    weight less their mean (:func:`~numpyro_uha._weights.log_spread`), where every
    weight of the column is finite (NaN elsewhere).

    The columns whose weights are all finite are computed together, with the same NumPy
    operations on contiguous rows as ``log_z_from_weights`` on one column (the same
    floats: NumPy's pairwise sums take a row as they take a vector); the others (a
    diverged draw) by ``log_z_from_weights`` itself, in order, so it raises as it would
    have column by column (the all-finite ones never raise: two draws or more)."""
    n, num_points = log_w.shape
    out = {name: np.full(num_points, np.nan) for name in ("iw", "iw_se", "elbo", "elbo_se",
                                                           "ess", "spread")}
    out["num_nonfinite"] = np.zeros(num_points, np.int64)
    finite = np.isfinite(log_w).all(axis=0)
    for i in np.flatnonzero(~finite):
        estimate = log_z_from_weights(log_w[:, i], num_transitions)
        for name in ("iw", "iw_se", "elbo", "elbo_se", "ess", "num_nonfinite"):
            out[name][i] = getattr(estimate, name)
    points = np.flatnonzero(finite)
    chunk = max(1, LOG_Z_COLUMNS_CHUNK // max(n, 1))
    for start in range(0, points.size, chunk):
        at = points[start:start + chunk]
        # a point's weights in a contiguous row (a slice copies faster than an index)
        whole = at[-1] - at[0] + 1 == at.size
        x = np.ascontiguousarray(log_w[:, at[0]:at[-1] + 1].T if whole else log_w.T[at])
        shift = np.max(x, axis=1)
        w = np.exp(x - shift[:, None])
        mean_w = np.mean(w, axis=1)
        elbo = np.mean(x, axis=1)
        out["elbo"][at] = elbo
        out["elbo_se"][at] = np.std(x, axis=1, ddof=1) / math.sqrt(n)
        out["iw"][at] = shift + np.log(mean_w)
        out["iw_se"][at] = np.std(w, axis=1, ddof=1) / (math.sqrt(n) * mean_w)
        out["ess"][at] = np.sum(w, axis=1) ** 2 / np.sum(w**2, axis=1)
        out["spread"][at] = shift - elbo
    return out


def _refuse_latents_in_cond(model, args, kwargs):
    """:func:`numpyro_uha.guide._refuse_latents_in_cond` for any guide's weights: an
    AutoNormal's log_z ran on wrong terms there, with only a standard-error warning
    (``UHAGuide`` refuses such a model at setup for the same reason)."""
    from numpyro import handlers

    from numpyro_uha.guide import _inside_cond, _refuse_latents_in_cond as refuse

    try:
        with handlers.block():
            trace = handlers.trace(handlers.seed(model, 0)).get_trace(*args, **kwargs)
    except Exception:  # noqa: BLE001 - only a check; the weights' own run reports errors
        return
    refuse([
        name for name, site in trace.items()
        if site["type"] == "sample" and not site["is_observed"] and _inside_cond(site)
    ])


def guide_log_weights(rng_key, model, guide, params, num_draws: int, *args, batch_size=1000, **kwargs):
    """One log importance weight log p(x, z) - log q(z) per draw, for *any* NumPyro guide.

    Each weight is a single-particle :class:`~numpyro.infer.Trace_ELBO` term of the
    guide's own trace, so AutoNormal, AutoDAIS and UHAGuide are scored by the same code
    (for UHA and DAIS guides it is the annealed log weight). Draws are vectorized in
    batches of ``batch_size``.
    """
    import jax
    from numpyro.infer import Trace_ELBO

    _refuse_latents_in_cond(model, args, kwargs)
    elbo = Trace_ELBO(num_particles=1)
    one = jax.jit(jax.vmap(lambda k: -elbo.loss(k, params, model, guide, *args, **kwargs)))
    keys = jax.random.split(rng_key, num_draws)
    return np.concatenate(
        [np.asarray(one(keys[i : i + batch_size])) for i in range(0, num_draws, batch_size)]
    )


def _autoguide_log_z(
    guide, rng_key, params, *args, num_draws: int = 1000, batch_size: int = 1000, **kwargs
) -> LogZEstimate:
    """:class:`LogZEstimate` of any trained NumPyro AutoGuide, from :func:`guide_log_weights`.

    Each log weight is log p(x, z) - log q(z) of one draw from the guide (for AutoDAIS
    its own annealed weight on the augmented space), so ``elbo`` is the guide's ELBO,
    the quantity ``-Trace_ELBO().loss`` estimates. ``num_transitions`` is the guide's
    ``K`` where it has one (AutoDAIS), else ``None``.

    :func:`~numpyro_uha.evaluation.log_z` calls this for every guide that is not a
    :class:`~numpyro_uha.UHAGuide` (for which it runs the annealing chains directly).

    Raises:
        TypeError: if ``guide`` is not a NumPyro AutoGuide (a hand-written guide
            function: combine :func:`guide_log_weights`, which takes the model, with
            :func:`log_z_from_weights`).
        RuntimeError: if the guide has not been set up (trained) yet.
        ValueError: if ``num_draws`` is not an integer ≥ 2, or ``params`` lacks some of
            the guide's parameters.
    """
    from numpyro import handlers
    from numpyro.infer.autoguide import AutoGuide

    from numpyro_uha._weights import GUIDE_ADVICE, _warn_if_poor_fit
    from numpyro_uha.evaluation.arviz import _check_positive_int

    if not isinstance(guide, AutoGuide):
        if callable(guide):
            raise TypeError(
                f"log_z: {getattr(guide, '__name__', type(guide).__name__)!r} is not a NumPyro "
                "AutoGuide, so log_z cannot find its model. For a hand-written guide "
                "function use log_z_from_weights(guide_log_weights(rng_key, model, guide, "
                "params, num_draws, *args)) (numpyro_uha.evaluation)."
            )
        raise TypeError(
            "log_z: expected a NumPyro guide (a UHAGuide or another "
            f"numpyro.infer.autoguide.AutoGuide such as AutoNormal), got {type(guide).__name__}."
        )
    if getattr(guide, "prototype_trace", None) is None:
        raise RuntimeError(
            f"log_z: the {type(guide).__name__} has not been set up: train it first "
            "(svi.run(...)) and pass its params."
        )
    num_draws = _check_positive_int("num_draws", num_draws, minimum=2)
    # An AutoGuide creates any parameter missing from params at its initial value, which
    # would silently score an untrained guide.
    with handlers.block():
        guide_trace = handlers.trace(
            handlers.seed(handlers.substitute(guide, data=params), 0)
        ).get_trace(*args, **kwargs)
    missing = sorted(
        name for name, site in guide_trace.items() if site["type"] == "param" and name not in params
    )
    if missing:
        raise ValueError(
            f"log_z: params lacks the {type(guide).__name__}'s parameter(s) {missing}; pass "
            "the params of the trained guide (svi_result.params)."
        )
    log_w = guide_log_weights(
        rng_key, guide.model, guide, params, num_draws, *args, batch_size=batch_size, **kwargs
    )
    estimate = log_z_from_weights(log_w, getattr(guide, "K", None))
    _warn_if_poor_fit(
        log_w, "log_z", stacklevel=4,
        advice=GUIDE_ADVICE,  # (UHAGuide's log Z is not computed here)
    )
    return estimate


class MinibatchBound(NamedTuple):
    """The full-data bound of a model with a subsampled plate, from fresh minibatches.

    Attributes:
        bound: the mean of −loss over ``num_batches`` minibatches (each with its own draw
            of the guide): an unbiased estimate of the full-data ELBO (for
            :class:`~numpyro_uha.UHALocalGuide`, of its UHA bound), higher is better.
        se: its Monte Carlo standard error, std / sqrt(num_batches).
        num_batches: minibatches used.
    """

    bound: float
    se: float
    num_batches: int

    def __str__(self) -> str:
        return f"full-data bound {self.bound:.2f} ± {self.se:.2f} ({self.num_batches} minibatches)"


def minibatch_bound(
    rng_key, model, guide, params, *args, num_batches: int = 100, loss=None, **kwargs
) -> MinibatchBound:
    """Estimate the full-data bound of a trained guide on a subsampled model: the mean of
    −``loss`` (default ``Trace_ELBO()``) over ``num_batches`` calls, each with its own key
    (``jax.random.split(rng_key, num_batches)``), so each with a fresh minibatch and draw.

    Any NumPyro guide works (``UHALocalGuide``, ``AutoNormal``, ...), which makes two fits
    comparable on the same footing, e.g. ``UHALocalGuide`` with ``decenter=True`` and
    without (keep the higher bound; see docs/how-to/local-latents.md). The loss is
    compiled once (run eagerly, NumPyro's subsampling would compile afresh at each call).
    A bound that is not finite raises ``FloatingPointError`` naming the minibatches.
    """
    from numpyro.infer import Trace_ELBO

    if not isinstance(num_batches, (int, np.integer)) or isinstance(num_batches, bool) \
            or num_batches < 2:
        raise ValueError(
            f"minibatch_bound: num_batches must be an integer of at least 2 (a mean and its "
            f"standard error), got {num_batches!r}."
        )
    import jax

    loss = Trace_ELBO() if loss is None else loss
    program = jax.jit(lambda key, p: loss.loss(key, p, model, guide, *args, **kwargs))
    keys = jax.random.split(rng_key, int(num_batches))
    bounds = -np.asarray([float(program(key, params)) for key in keys], np.float64)
    bad = np.flatnonzero(~np.isfinite(bounds))
    if bad.size:
        raise FloatingPointError(
            f"minibatch_bound: the loss was not finite on {bad.size} of {num_batches} "
            f"minibatches (indices {bad[:10].tolist()}): the guide's parameters or the "
            "data give a NaN or infinite ELBO there."
        )
    return MinibatchBound(
        bound=float(bounds.mean()), se=float(bounds.std(ddof=1) / math.sqrt(num_batches)),
        num_batches=int(num_batches),
    )
