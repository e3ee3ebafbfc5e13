"""Evaluation layer: log Z estimates and diagnostics built on the guide's weighted draws."""

from numpyro_uha.evaluation.logz import LogZEstimate, guide_log_weights, log_z_from_weights

__all__ = ["LogZEstimate", "guide_log_weights", "log_z_from_weights"]
