"""numpyro-uha: Uncorrected Hamiltonian Annealing for NumPyro.

The pure-JAX algorithm lives in :mod:`numpyro_uha.core`; :class:`UHAGuide` is the NumPyro
AutoGuide built on it.
"""

# before anything starts JAX's backends: XLA reads XLA_FLAGS then (_linalg_hang.py)
from numpyro_uha import _linalg_hang

_linalg_hang.avoid_hang()

from numpyro_uha.guide import (  # noqa: E402
    GROUPS,
    UHADivergenceError,
    UHADivergenceWarning,
    UHADrawsOffWarning,
    UHAFitWarning,
    UHAGuide,
    UHAImproperPosteriorWarning,
    UHASupportWarning,
    UHANonfiniteDrawsWarning,
    UHAWorseThanStartWarning,
    WeightedDraws,
)
from numpyro_uha._linalg_hang import UHALinalgHangWarning
from numpyro_uha._memory_maps import UHAMemoryMapWarning
from numpyro_uha.core.sharding import shard_particles
from numpyro_uha.io import load_fit, save_fit
from numpyro_uha.local import GlobalLogZ, LocalLogZ, UHALocalGuide

__version__ = "0.1.0"

__all__ = [
    "UHALocalGuide",
    "GlobalLogZ",
    "LocalLogZ",
    "GROUPS",
    "UHADivergenceError",
    "UHADivergenceWarning",
    "UHAFitWarning",
    "UHADrawsOffWarning",
    "UHAWorseThanStartWarning",
    "UHAGuide",
    "UHAImproperPosteriorWarning",
    "UHASupportWarning",
    "UHANonfiniteDrawsWarning",
    "UHALinalgHangWarning",
    "UHAMemoryMapWarning",
    "WeightedDraws",
    "load_fit",
    "save_fit",
    "shard_particles",
    "__version__",
]
