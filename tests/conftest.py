"""Suite-wide test settings.

XLA's backend (LLVM) optimizations are turned off for the programs the tests compile in
this process, as the docs, notebook and benchmark-smoke runners already do for theirs:
the suite's models are small, so compiling dominates its run time, and compiling without
backend optimizations is several times faster. It changes what the programs compute by
floating-point rounding at most. A level the user set in ``XLA_FLAGS`` is kept. It must be
set before JAX creates its CPU backend, which no test module has done when this runs.
"""

import os

_FLAG = "--xla_backend_optimization_level"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS"), f"{_FLAG}=0"]))
