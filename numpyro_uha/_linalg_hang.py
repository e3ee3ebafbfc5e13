"""A warning for models whose log density calls LAPACK on a CPU with jaxlib 0.10.

jaxlib 0.10.0 to 0.10.2 split a batched LAPACK call on the CPU (a Cholesky factor, a
triangular solve, an eigendecomposition, ... of a stack of matrices) into pieces run on
XLA's intra-op thread pool, and wait for them on a thread of that same pool. Where a
program runs as many such calls at once as the pool has threads (one per core), every
thread waits for pieces no thread is left to run: the call never returns, at 0 % CPU.
UHA's vmapped chains batch every linear-algebra call of the model over the draws, so a
model with, e.g., a ``MultivariateNormal`` likelihood over a plate of rows hung in
``sample_posterior`` on a 2-core machine (100 rows and 8 coordinates: 100 draws per
chunk ran, 500 hung; 2 000 draws with ``sample_batch_size=100`` ran in 6 s). jaxlib 0.11
builds do not take that path.

XLA's flag ``--xla_cpu_enable_concurrency_optimized_scheduler=false`` avoids it: a
program with two independent vmapped triangular solves of 40 000 8 × 8 systems hung in
3 of 3 processes on a 2-core machine without it (each killed after 40-60 s) and ran 450
calls in 3 processes with it (200 in 3.3-3.8 s); the factor model above drew its 2 000
draws at 500 per chunk with it. ``import numpyro_uha`` adds that flag to ``XLA_FLAGS``
(see :func:`avoid_hang`) on an affected jaxlib where JAX has not yet started its
backends, the user did not set the flag, and ``NUMPYRO_UHA_KEEP_XLA_FLAGS`` is not set;
it takes effect for the whole process, which compiled sonar's UHA training step and
draws no slower with it (2-core CPU). Where it is not in effect (JAX already started,
or opted out), the guide warns at the setup of a model whose log density calls LAPACK.
"""

from __future__ import annotations

import os
import re
import warnings

import jax
import jaxlib

#: the jaxpr primitives that lower to jaxlib's CPU LAPACK kernels
LAPACK_PRIMITIVE = re.compile(
    r"\b(cholesky|triangular_solve|lu|eigh|eig|svd|qr|householder_product|geqrf|"
    r"orgqr|tridiagonal|tridiagonal_solve|schur|hessenberg)\["
)

_warned = False


class UHALinalgHangWarning(RuntimeWarning):
    """The model's log density calls LAPACK (Cholesky, triangular solves, ...) and this
    is jaxlib 0.10 on a CPU, whose batched LAPACK kernels can hang a program that runs
    several of them at once (see :mod:`numpyro_uha._linalg_hang`). Shown once per
    process."""


def affected(version: str | None = None, backend: str | None = None) -> bool:
    """Whether this jaxlib (``version``, default the installed one) on ``backend``
    (default JAX's) is one whose batched CPU LAPACK kernels can hang."""
    version = jaxlib.__version__ if version is None else version
    backend = jax.default_backend() if backend is None else backend
    parts = version.split(".")
    return backend == "cpu" and parts[:2] == ["0", "10"]


#: XLA's flag that keeps jaxlib 0.10's batched CPU LAPACK kernels from wedging the pool
FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"

#: set to anything but "" or "0" to keep ``import numpyro_uha`` from adding :data:`FLAG`
OPT_OUT = "NUMPYRO_UHA_KEEP_XLA_FLAGS"


def _backends_started() -> bool | None:
    """Whether JAX has started its backends (``XLA_FLAGS`` is read then); ``None``
    where this JAX cannot tell."""
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except Exception:  # noqa: BLE001 - a JAX without it
        return None


def _flag_named(flags: str) -> bool:
    return FLAG.split("=")[0] in flags


def _flag_off(flags: str) -> bool:
    """Whether ``flags`` turn the scheduler off (the last setting counts, as in XLA)."""
    values = re.findall(re.escape(FLAG.split("=")[0]) + r"=(\S+)", flags)
    return bool(values) and values[-1].lower() in ("false", "0")


def avoid_hang(environ=None) -> bool:
    """Add :data:`FLAG` to ``XLA_FLAGS`` where it avoids the hang: on jaxlib 0.10 (any
    backend: the warm start can run on the host CPU), before JAX starts its backends,
    where the user's ``XLA_FLAGS`` does not name it and :data:`OPT_OUT` is not set.
    Whether it added it. Called by ``import numpyro_uha``."""
    environ = os.environ if environ is None else environ
    if environ.get(OPT_OUT, "") not in ("", "0"):
        return False
    if not affected(backend="cpu"):  # this jaxlib's CPU kernels are not the ones
        return False
    if _flag_named(environ.get("XLA_FLAGS", "")) or _backends_started() is not False:
        return False
    environ["XLA_FLAGS"] = " ".join(filter(None, [environ.get("XLA_FLAGS", ""), FLAG]))
    return True


#: ``XLA_FLAGS`` as JAX's backends read it: captured at the first setup that asks
#: (after the backends started), so a later change of the variable does not count
_flags_in_effect: str | None = None


def flag_in_effect() -> bool:
    """Whether this process's XLA runs with :data:`FLAG` (in ``XLA_FLAGS`` as JAX's
    backends started: the guide's setup has started them when it asks)."""
    global _flags_in_effect
    if _flags_in_effect is None:
        _flags_in_effect = os.environ.get("XLA_FLAGS", "")
    return _flag_off(_flags_in_effect)


def warn_if_linalg_may_hang(jaxpr_text: str, where: str = "UHAGuide") -> bool:
    """Warn (once per process) where the model's log density, as ``jaxpr_text``, calls
    a LAPACK kernel on an :func:`affected` jaxlib without :data:`FLAG` in effect;
    whether it warned."""
    global _warned
    if _warned or not affected() or flag_in_effect():
        return False
    found = sorted(set(LAPACK_PRIMITIVE.findall(jaxpr_text)))
    if not found:
        return False
    _warned = True
    warnings.warn(
        f"{where}: the model's log density calls LAPACK ({', '.join(found)}; e.g. a "
        f"MultivariateNormal or a Cholesky factor), and jaxlib {jaxlib.__version__} on "
        "the CPU can hang where a program runs several batched LAPACK calls at once, as "
        "this guide's chains do over their draws: the call never returns, at 0 % CPU "
        "(a jaxlib 0.10 bug; its 0.11 builds do not have it). XLA's flag "
        f"{FLAG} avoids it; import numpyro_uha adds it to XLA_FLAGS unless JAX has "
        f"already started (as here) or {OPT_OUT} is set. Start the process with "
        f"XLA_FLAGS={FLAG} (or import numpyro_uha before any JAX computation), install "
        "jaxlib 0.11, or give the guide a smaller sample_batch_size (e.g. 64): a factor "
        "model with a MultivariateNormal likelihood over 100 rows hung at 500 draws per "
        "chunk and ran at 100.",
        UHALinalgHangWarning,
        stacklevel=4,
    )
    return True


__all__ = ["FLAG", "UHALinalgHangWarning", "affected", "avoid_hang", "warn_if_linalg_may_hang"]
