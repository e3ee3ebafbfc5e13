"""Evaluation layer: log Z estimates, Hamiltonian AIS, the log Z sandwich, a log Z bracket
from posterior draws alone, K extrapolation, ArviZ export (importance-resampled, with the
pointwise log-likelihood for LOO and WAIC) with PSIS k̂, moment comparisons against NUTS,
and the annealed chain transition by transition (each log weight's annealing and energy
parts; :func:`plot_annealing`).

Guide-level functions take a trained :class:`~numpyro_uha.UHAGuide` (:func:`log_z` takes
any NumPyro AutoGuide); the ``annealed_*`` functions and :func:`hais_grid_search` work on
any JAX log density.
"""

from numpyro_uha.evaluation.arviz import (
    KHAT_BAD,
    KHAT_GOOD,
    importance_resample,
    khat_verdict,
    psis_khat,
    to_inference_data,
    weighted_moments,
)
from numpyro_uha.evaluation.diagnostics import (
    AnnealingDiagnostics,
    annealing_diagnostics,
    plot_annealing,
)
from numpyro_uha.evaluation.bracket import LogZBracket, log_z_bracket, log_z_bracket_from_draws
from numpyro_uha.evaluation.estimators import (
    HAISGridResult,
    HAISResult,
    LogZSandwich,
    annealed_hais,
    annealed_log_z,
    annealed_sandwich,
    extrapolate,
    hais,
    hais_grid_search,
    log_z,
    sandwich,
)
from numpyro_uha.evaluation.logz import (
    LogZEstimate,
    MinibatchBound,
    guide_log_weights,
    log_z_from_weights,
    minibatch_bound,
)
from numpyro_uha.evaluation.nuts import NUTSComparison, compare_with_nuts, plot_nuts_comparison

__all__ = [
    "AnnealingDiagnostics",
    "annealing_diagnostics",
    "plot_annealing",
    "KHAT_BAD",
    "KHAT_GOOD",
    "NUTSComparison",
    "compare_with_nuts",
    "importance_resample",
    "khat_verdict",
    "plot_nuts_comparison",
    "psis_khat",
    "to_inference_data",
    "weighted_moments",
    "HAISGridResult",
    "HAISResult",
    "LogZBracket",
    "LogZEstimate",
    "LogZSandwich",
    "MinibatchBound",
    "annealed_hais",
    "annealed_log_z",
    "annealed_sandwich",
    "extrapolate",
    "guide_log_weights",
    "hais",
    "hais_grid_search",
    "log_z",
    "log_z_bracket",
    "log_z_bracket_from_draws",
    "log_z_from_weights",
    "minibatch_bound",
    "sandwich",
]
