"""log Z estimates with standard errors from UHA (or any importance) log weights, and
from the log weights of any NumPyro AutoGuide."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

__all__ = ["LogZEstimate", "guide_log_weights", "log_z_from_weights"]


class LogZEstimate(NamedTuple):
    """Two estimates of log Z from N log weights.

    Attributes:
        elbo: mean of log w, a stochastic lower bound on log Z (in expectation).
        elbo_se: its Monte Carlo standard error, std(log w) / sqrt(N).
        iw: log (1/N) Σ exp(log w_i), the importance-weighted bound: also a lower bound
            in expectation, tighter than ``elbo``, and consistent for log Z as N grows.
        iw_se: delta-method standard error of ``iw``, std(w) / (sqrt(N) · mean(w)).
            Unreliable when the weights are heavy-tailed (see ``ess``).
        ess: effective sample size of the normalized weights, (Σw)² / Σw².
        num_draws: N.
        num_transitions: K used to produce the weights, if known.
    """

    elbo: float
    elbo_se: float
    iw: float
    iw_se: float
    ess: float
    num_draws: int
    num_transitions: int | None = None

    def __str__(self) -> str:
        k = "" if self.num_transitions is None else f", K={self.num_transitions}"
        return (
            f"ELBO {self.elbo:.4f} ± {self.elbo_se:.4f} | IW log Z {self.iw:.4f} ± "
            f"{self.iw_se:.4f} | ESS {self.ess:.1f} of {self.num_draws}{k}"
        )


def log_z_from_weights(log_weights, num_transitions: int | None = None) -> LogZEstimate:
    """Summarize log importance weights as :class:`LogZEstimate`.

    Raises:
        FloatingPointError: if any weight is NaN or +inf (a diverged draw), or if there are
            fewer than two draws to estimate a standard error from.
    """
    log_w = np.asarray(log_weights, dtype=np.float64).ravel()
    if log_w.size < 2:
        raise FloatingPointError("log_z_from_weights needs at least two log weights.")
    bad = int(np.sum(np.isnan(log_w) | (log_w == np.inf)))
    if bad:
        raise FloatingPointError(
            f"{bad} of {log_w.size} log weights are NaN or +inf: the estimate would be "
            "meaningless. The sampler diverged; lower the step size."
        )
    n = log_w.size
    shift = np.max(log_w)
    w = np.exp(log_w - shift)
    mean_w = np.mean(w)
    return LogZEstimate(
        elbo=float(np.mean(log_w)),
        # A draw of zero weight (log w = -inf) makes the ELBO -inf with no finite error.
        elbo_se=float(np.std(log_w, ddof=1) / math.sqrt(n)) if np.all(np.isfinite(log_w)) else math.inf,
        iw=float(shift + np.log(mean_w)),
        iw_se=float(np.std(w, ddof=1) / (math.sqrt(n) * mean_w)),
        ess=float(np.sum(w) ** 2 / np.sum(w**2)),
        num_draws=n,
        num_transitions=num_transitions,
    )


def guide_log_weights(rng_key, model, guide, params, num_draws: int, *args, batch_size=1000, **kwargs):
    """One log importance weight log p(x, z) - log q(z) per draw, for *any* NumPyro guide.

    Each weight is a single-particle :class:`~numpyro.infer.Trace_ELBO` term of the
    guide's own trace, so AutoNormal, AutoDAIS and UHAGuide are scored by the same code
    (for UHA and DAIS guides it is the annealed log weight). Draws are vectorized in
    batches of ``batch_size``.
    """
    import jax
    from numpyro.infer import Trace_ELBO

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
    return log_z_from_weights(log_w, getattr(guide, "K", None))
