"""The annealed chain of a trained :class:`~numpyro_uha.UHAGuide`, transition by
transition, in numbers (:func:`annealing_diagnostics`) and in one figure
(:func:`plot_annealing`).

A UHA draw's log weight is ``log p̄(z_{K+1}) − log q(z_1) + Σ_m Δ_m``, where ``Δ_m`` is
transition m's momentum log-density ratio (paper eq. 13). Since each transition's
leapfrog energy error is ``ΔH_m = log π_m(z_m) − log π_m(z_{m+1}) − Δ_m`` (π_m its bridging
density), the same log weight is, exactly,

    log w = Σ_{m=1}^{K+1} [log π_m(z_m) − log π_{m−1}(z_m)]  −  Σ_{m=1}^{K} ΔH_m
          = annealing part                                  +  energy part

with π_0 = q and π_{K+1} = p̄: the first sum is annealed importance sampling's weight
(zero variance where the bridges move slowly against the chain's mixing; exactly
log Z where q is the posterior), the second the integrator's error (zero variance with
infinitesimal steps). Where the weights vary (a high k̂, a low ESS), which part varies
says what to change: the annealing part calls for more transitions or a longer fit, the
energy part for smaller steps.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from numpyro_uha._keywords import check_model_keywords
from numpyro_uha._weights import _warn_if_poor_fit, khat_verdict, psis_khat
from numpyro_uha.evaluation.arviz import _check_positive_int
from numpyro_uha.evaluation.logz import log_z_from_weights

__all__ = ["AnnealingDiagnostics", "annealing_diagnostics", "plot_annealing"]

#: The quantiles of the energy error over the draws, per transition.
ENERGY_QUANTILES = (0.1, 0.5, 0.9)


class AnnealingDiagnostics(NamedTuple):
    """Per-transition summaries of a trained guide's draws (:func:`annealing_diagnostics`).

    Attributes:
        betas: β_1..β_K, the learned bridging coefficients, shape ``(K,)``.
        step_sizes: ε_1..ε_K, the learned leapfrog step sizes, shape ``(K,)``.
        damping: η, the learned momentum persistence.
        energy_error: quantiles (``ENERGY_QUANTILES``: 10 %, 50 %, 90 %) over the draws of
            each transition's absolute leapfrog energy error |ΔH| in nats, shape
            ``(K, 3)``. Well below 1 nat: the steps are small for that bridge; several
            nats: they are large, and the weights pay for it.
        acceptance: each transition's mean of min(1, exp(−ΔH)) over the draws, the
            acceptance probability a Metropolis-corrected chain (HAIS) would give these
            proposals, shape ``(K,)``.
        annealing_part: each draw's annealing part of the log weight (module
            docstring), ``log w − energy_part``, shape ``(num_draws,)``.
        energy_part: each draw's energy part, −Σ_m ΔH_m, shape ``(num_draws,)``.
        log_weights: the draws' log weights, shape ``(num_draws,)``.
        elbo: their mean, the ELBO estimate.
        khat: Pareto k̂ of the weights (:func:`~numpyro_uha.evaluation.psis_khat`).
        ess: the weights' effective sample size, (Σw)² / Σw².
        num_dropped: diverged draws left out (``nonfinite="drop"``).
    """

    betas: np.ndarray
    step_sizes: np.ndarray
    damping: float
    energy_error: np.ndarray
    acceptance: np.ndarray
    annealing_part: np.ndarray
    energy_part: np.ndarray
    log_weights: np.ndarray
    elbo: float
    khat: float
    ess: float
    num_dropped: int


def annealing_diagnostics(
    guide, rng_key, params, *args, num_draws=1000, **kwargs
) -> AnnealingDiagnostics:
    """Per-transition summaries of ``num_draws`` draws of a trained ``UHAGuide``.

    The draws are those of ``guide.sample_posterior_with_log_weights(rng_key, params,
    *args, sample_shape=(num_draws,), **kwargs)`` (diverged ones dropped, with a
    warning); ``*args`` and ``**kwargs`` are the model's arguments, as in training. Warns
    (:class:`~numpyro_uha.UHAFitWarning`) where the weights say the fit is poor.

    Raises:
        TypeError: for a guide other than ``UHAGuide``.
        ValueError: if ``num_draws`` is not an integer of at least 2.
    """
    from numpyro_uha.guide import UHAGuide

    if not isinstance(guide, UHAGuide):
        raise TypeError(
            f"annealing_diagnostics takes a trained UHAGuide, got {type(guide).__name__}."
        )
    num_draws = _check_positive_int("num_draws", num_draws, minimum=2)
    check_model_keywords(guide._user_model, kwargs, annealing_diagnostics)
    # the draws of sample_posterior_with_log_weights; the weights' warning named here
    draws = guide._draws(rng_key, params, args, kwargs, (num_draws,))
    annealing = guide.get_annealing_params(params)
    info = draws.info
    log_weights = np.asarray(draws.log_weights, np.float64)
    # |ΔH| of each draw's transitions: log_accept_ratio is −ΔH
    log_accept = np.asarray(info.log_accept_ratio, np.float64)  # (num_draws, K)
    energy = np.abs(log_accept)
    energy_part = log_accept.sum(axis=1)
    khat = _warn_if_poor_fit(log_weights, "annealing_diagnostics", stacklevel=3)
    estimate = log_z_from_weights(log_weights)
    return AnnealingDiagnostics(
        betas=np.asarray(annealing.betas),
        step_sizes=np.asarray(annealing.step_sizes),
        damping=float(annealing.damping),
        energy_error=np.quantile(energy, ENERGY_QUANTILES, axis=0).T,
        acceptance=np.exp(np.minimum(log_accept, 0.0)).mean(axis=0),
        annealing_part=log_weights - energy_part,
        energy_part=energy_part,
        log_weights=log_weights,
        elbo=estimate.elbo,
        khat=float(psis_khat(log_weights) if khat is None else khat),
        ess=estimate.ess,
        num_dropped=int(draws.num_dropped),
    )


def plot_annealing(diagnostics, ax=None, losses=None):
    """The chain of a trained guide in one figure, from :func:`annealing_diagnostics`.

    Four panels, one per question (five with ``losses``):

    - *schedule*: the learned β_m and step sizes ε_m against the transition m;
    - *energy error*: each transition's median |ΔH| with its 10-90 % band (log scale;
      the dotted line is 1 nat), and the acceptance a Metropolis test would give;
    - *where log w varies*: histograms of the annealing part and the energy part of the
      log weights (module docstring), each minus its mean: the wider one is what to
      act on (more transitions or a longer fit; smaller steps);
    - *weights*: the histogram of the log weights relative to the largest, titled
      with k̂ (and its verdict) and the ESS;
    - *loss* (with ``losses``, e.g. ``svi.run(...).losses``): the SVI loss and its
      running median, to see whether training had levelled off.

    Does not call ``plt.show()``.

    Args:
        diagnostics: an :class:`AnnealingDiagnostics`.
        ax: matplotlib Axes to draw on, as many as panels (4, or 5 with ``losses``);
            by default a new figure.
        losses: the SVI losses (a sequence or array), or ``None``.

    Returns:
        matplotlib.figure.Figure: the figure holding the panels.

    Raises:
        TypeError: if ``diagnostics`` is not an :class:`AnnealingDiagnostics`.
        ValueError: if ``ax`` has the wrong number of Axes, or ``losses`` is not a
            non-empty one-dimensional sequence.
    """
    if not isinstance(diagnostics, AnnealingDiagnostics):
        raise TypeError(
            "plot_annealing takes the AnnealingDiagnostics of annealing_diagnostics(guide, "
            f"rng_key, params, *args), got {type(diagnostics).__name__}."
        )
    if losses is not None:
        losses = np.asarray(losses, np.float64)
        if losses.ndim != 1 or losses.size == 0:
            raise ValueError(
                "plot_annealing: losses must be a non-empty one-dimensional sequence (e.g. "
                f"svi.run(...).losses), got shape {losses.shape}."
            )
    num_panels = 4 if losses is None else 5
    if ax is None:
        from matplotlib.figure import Figure

        fig = Figure(figsize=(11, 7.5 if losses is None else 10.5), layout="constrained")
        grid = fig.subplots(2 if losses is None else 3, 2)
        axes = list(np.ravel(grid))
        if losses is not None:  # the loss panel spans the bottom row
            spec = axes[4].get_subplotspec().get_gridspec()
            axes[4].remove()
            axes[5].remove()
            axes[4] = fig.add_subplot(spec[2, :])
            axes = axes[:5]
    else:
        axes = list(np.ravel(ax)) if not hasattr(ax, "plot") else [ax]
        if len(axes) != num_panels:
            raise ValueError(
                f"plot_annealing: ax must be {num_panels} matplotlib Axes"
                f"{' (4 without losses)' if losses is not None else ' (5 with losses)'}, "
                f"got {len(axes)}."
            )
        fig = axes[0].figure
    d = diagnostics
    m = np.arange(1, d.betas.shape[0] + 1)

    schedule = axes[0]
    schedule.plot(m, d.betas, "o-", ms=3, color="C0", label="β")
    schedule.set_ylim(0.0, 1.0)
    schedule.set_xlabel("transition m")
    schedule.set_ylabel("β_m", color="C0")
    steps = schedule.twinx()
    steps.plot(m, d.step_sizes, "s-", ms=3, color="C1", label="ε")
    steps.set_yscale("log")
    steps.set_ylabel("step size ε_m", color="C1")
    schedule.set_title(f"learned schedule (damping η = {d.damping:.3g})")

    energy = axes[1]
    energy.fill_between(m, d.energy_error[:, 0], d.energy_error[:, 2], alpha=0.3, color="C2",
                        label="10-90 %")
    energy.plot(m, d.energy_error[:, 1], "o-", ms=3, color="C2", label="median")
    energy.axhline(1.0, color="k", ls=":", lw=1)
    if np.any(d.energy_error > 0):
        energy.set_yscale("log")
    energy.set_xlabel("transition m")
    energy.set_ylabel("|ΔH| (nats)")
    energy.legend(loc="upper left", fontsize="small")
    energy.set_title(f"leapfrog energy error (mean acceptance {d.acceptance.mean():.2f})")

    parts = axes[2]
    centered = [
        (d.annealing_part - d.annealing_part.mean(), "annealing part", "C0"),
        (d.energy_part - d.energy_part.mean(), "energy part", "C3"),
    ]
    everything = np.concatenate([c for c, _, _ in centered])
    low, high = float(everything.min()), float(everything.max())
    edges = np.linspace(low, high, 41) if high > low else np.array([low - 0.5, low + 0.5])
    for values, label, color in centered:
        parts.hist(values, bins=edges, alpha=0.5, color=color,
                   label=f"{label} (sd {values.std():.3g})")
    parts.set_xlabel("nats, each part minus its mean")
    parts.set_ylabel("draws")
    parts.legend(loc="upper left", fontsize="small")
    parts.set_title(f"where log w varies (sd {d.log_weights.std():.3g})")

    weights = axes[3]
    relative = d.log_weights - d.log_weights.max()
    weights.hist(relative, bins=min(50, max(10, relative.size // 20)), color="C4")
    weights.set_xlabel("log w − max log w")
    weights.set_ylabel("draws")
    dropped = f", {d.num_dropped} dropped" if d.num_dropped else ""
    weights.set_title(
        f"log weights: k̂ {d.khat:.2f} ({khat_verdict(d.khat)}), ESS {d.ess:.0f} of "
        f"{relative.size}{dropped}"
    )

    if losses is not None:
        loss = axes[4]
        steps_done = np.arange(1, losses.size + 1)
        loss.plot(steps_done, losses, color="0.7", lw=0.5, label="loss")
        window = max(1, losses.size // 50)
        if losses.size >= 2 * window and window > 1:
            padded = np.lib.stride_tricks.sliding_window_view(losses, window)
            loss.plot(steps_done[window - 1:], np.median(padded, axis=1), color="C0",
                      label=f"running median ({window})")
        finite = losses[np.isfinite(losses)]
        if finite.size:  # the first steps' losses can dwarf the rest
            low, high = np.quantile(finite, [0.0, 0.95])
            pad = 0.05 * (high - low) if high > low else 1.0
            loss.set_ylim(low - pad, high + pad)
        loss.set_xlabel("SVI step")
        loss.set_ylabel("loss (−ELBO)")
        loss.legend(loc="upper right", fontsize="small")
        loss.set_title("training")
    return fig
