"""Suite-wide test settings.

XLA's backend (LLVM) optimizations are turned off for the programs the tests compile in
this process, as the docs, notebook and benchmark-smoke runners already do for theirs:
the suite's models are small, so compiling dominates its run time, and compiling without
backend optimizations is several times faster. It changes what the programs compute by
floating-point rounding at most. A level the user set in ``XLA_FLAGS`` is kept. It must be
set before JAX creates its CPU backend, which no test module has done when this runs.

For the same reason each test process keeps a persistent compilation cache in a
temporary folder of its own, removed when it exits: many tests build a new guide on the
same model, whose programs are new ``jax.jit`` objects with the same XLA computation, and
the cache serves those from the first compilation (measured: two local-guide test files
73 s → 36 s). A cached program is the compiled one, so nothing computed changes, and JAX
still reports it as a compilation (``/jax/core/compile/backend_compile_duration`` and the
``jax.log_compiles`` record both wrap the cache lookup), so the tests that count
compilations count the same. Subprocesses the tests start do not inherit it. A cache
folder the user set (``JAX_COMPILATION_CACHE_DIR``) is used instead.
"""

import atexit
import os
import shutil
import tempfile

_FLAG = "--xla_backend_optimization_level"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS"), f"{_FLAG}=0"]))

import jax  # noqa: E402  (after XLA_FLAGS: the backend is created lazily, at first use)

if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    _CACHE_DIR = tempfile.mkdtemp(prefix="numpyro-uha-test-jax-cache-")
    atexit.register(shutil.rmtree, _CACHE_DIR, ignore_errors=True)
    jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
