"""A process's memory mappings, which JAX's compiled programs use up.

On CPU every compiled XLA program maps its code into memory (about six mappings each),
and JAX keeps the programs it compiled in its caches for the life of the process, even
after the functions and guides that compiled them are gone. One ``UHAGuide`` fit compiles
about 175 programs (about 1 100 mappings; NumPyro's SVI with ``AutoNormal``, about 40).
Linux caps a process's mappings (``vm.max_map_count``, 65 530 by default): at the cap,
XLA's compiler fails ("LLVM compilation error: Cannot allocate memory") and the process
segfaults, losing the run. A loop of about 55 fits in one process reached it.

:func:`relieve` is called where a guide sets up (outside JAX transforms): past
:data:`CLEAR_FRACTION` of the cap it clears JAX's caches (:func:`jax.clear_caches`,
which frees the programs of guides that are gone; live ones compile again when next
called) and warns once per process, saying what to do in a loop of many fits.
Elsewhere than Linux (no ``/proc``) it does nothing.
"""

from __future__ import annotations

import gc
import warnings

import jax

from numpyro_uha.core import executables

#: clear JAX's caches once a process holds this fraction of its mapping cap
CLEAR_FRACTION = 0.5

_warned = False


class UHAMemoryMapWarning(RuntimeWarning):
    """A guide's setup cleared JAX's caches (:func:`jax.clear_caches`): the process
    held more than half of its memory mapping cap (``vm.max_map_count``), mostly JAX's
    compiled programs, and at the cap XLA's compiler fails and the process crashes.
    Shown once per process; see the how-to "Devices", section "Many fits in one
    process"."""


def _count_and_cap():
    """(the process's memory mappings, its cap), or ``None`` where ``/proc`` has no
    answer."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            cap = int(f.read())
        with open("/proc/self/maps", "rb") as f:
            count = sum(1 for _ in f)
    except (OSError, ValueError):
        return None
    return count, cap


def relieve(where: str, fraction: float = CLEAR_FRACTION) -> bool:
    """Clear JAX's caches if this process holds more than ``fraction`` of its memory
    mapping cap; warn the first time. Returns whether it cleared."""
    global _warned
    state = _count_and_cap()
    if state is None or state[0] <= fraction * state[1]:
        return False
    count, cap = state
    jax.clear_caches()
    executables.clear()  # the warm start's steps loaded from disk (core/executables.py)
    gc.collect()
    if not _warned:
        _warned = True
        warnings.warn(
            f"{where}: this process holds {count} memory mappings, over "
            f"{fraction:.0%} of its cap of {cap} (vm.max_map_count), mostly JAX's "
            "compiled programs, which JAX keeps for the life of the process (a UHA fit "
            "compiles about 175 of them). At the cap XLA's compiler fails and the process "
            "crashes, so JAX's caches were cleared (jax.clear_caches()): programs still in "
            "use compile again when next called. In a loop of many fits, call "
            "jax.clear_caches() between fits, or raise the cap (sysctl -w "
            "vm.max_map_count=262144).",
            UHAMemoryMapWarning,
            stacklevel=3,
        )
    return True
