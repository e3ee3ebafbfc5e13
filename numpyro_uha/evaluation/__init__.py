"""Evaluation layer: log Z estimates, Hamiltonian AIS, the log Z sandwich, K extrapolation.

Guide-level functions take a trained :class:`~numpyro_uha.UHAGuide`; the ``annealed_*``
functions and :func:`hais_grid_search` work on any JAX log density.
"""

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
from numpyro_uha.evaluation.logz import LogZEstimate, guide_log_weights, log_z_from_weights

__all__ = [
    "HAISGridResult",
    "HAISResult",
    "LogZEstimate",
    "LogZSandwich",
    "annealed_hais",
    "annealed_log_z",
    "annealed_sandwich",
    "extrapolate",
    "guide_log_weights",
    "hais",
    "hais_grid_search",
    "log_z",
    "log_z_from_weights",
    "sandwich",
]
