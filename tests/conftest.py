"""Suite-wide test settings.

XLA's backend (LLVM) optimizations are turned off for the programs the tests compile in
this process, as the docs, notebook and benchmark-smoke runners already do for theirs:
the suite's models are small, so compiling dominates its run time, and compiling without
backend optimizations is several times faster. It changes what the programs compute by
floating-point rounding at most. A level the user set in ``XLA_FLAGS`` is kept. It must be
set before JAX creates its CPU backend, which no test module has done when this runs.

JAX's persistent compilation cache is on for the run, in a new empty folder shared by the
xdist workers and every subprocess the tests start (docs examples, notebooks, benchmark
smoke runs, the sharding workers), removed at the end: many tests compile the same
programs (the same small models, the same warm start), and a program compiled once is
read back instead of compiled again. Every run starts cold, so its time is what CI sees.
The cached programs are the ones XLA compiled; no result depends on the cache. A cache
folder the user set in ``JAX_COMPILATION_CACHE_DIR`` is kept (and not removed).

Each test process clears JAX's in-memory caches after a test once it holds 30 % of its
memory mapping cap (``_bounded_memory_maps``): a worker that had run a few hundred fits
crossed the cap and segfaulted inside XLA (in the compiler, or in the persistent cache's
write of a program it had just compiled), and xdist then hung instead of failing. A
crashed worker now ends the run at once (``--max-worker-restart=0`` in pyproject.toml).
"""

import atexit
import gc
import os
import shutil
import tempfile

import pytest

_FLAG = "--xla_backend_optimization_level"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS"), f"{_FLAG}=0"]))

# set in the controlling process before the xdist workers start, so they inherit it
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="numpyro-uha-tests-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    # every program, however small or quick to compile (the defaults skip those)
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


@pytest.fixture(autouse=True)
def _bounded_memory_maps():
    """After each test, JAX's caches are cleared once the process holds 30 % of its
    memory mapping cap (``vm.max_map_count``): every compiled CPU program maps memory and
    JAX keeps them all, and a test worker that ran a few hundred fits crossed the cap and
    segfaulted inside XLA's compiler (see ``numpyro_uha/_memory_maps.py``, whose own
    guard, at 50 % and with a warning, is for users' processes and is tested apart)."""
    yield
    from numpyro_uha import _memory_maps

    state = _memory_maps._count_and_cap()
    if state is not None and state[0] > 0.3 * state[1]:
        import jax

        jax.clear_caches()
        gc.collect()
