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
builds do not take that path. This module only says so: the guide cannot free a pool
that XLA has wedged.
"""

from __future__ import annotations

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


def warn_if_linalg_may_hang(jaxpr_text: str, where: str = "UHAGuide") -> bool:
    """Warn (once per process) where the model's log density, as ``jaxpr_text``, calls
    a LAPACK kernel on an :func:`affected` jaxlib; whether it warned."""
    global _warned
    if _warned or not affected():
        return False
    found = LAPACK_PRIMITIVE.search(jaxpr_text)
    if found is None:
        return False
    _warned = True
    warnings.warn(
        f"{where}: the model's log density calls LAPACK ({found.group(1)}; e.g. a "
        f"MultivariateNormal or a Cholesky factor), and jaxlib {jaxlib.__version__} on "
        "the CPU can hang where a program runs several batched LAPACK calls at once, as "
        "this guide's chains do over their draws: the call never returns, at 0 % CPU "
        "(a jaxlib 0.10 bug; its 0.11 builds do not have it). If sample_posterior, "
        "log_z or training hangs, install jaxlib 0.11, or give the guide a smaller "
        "sample_batch_size (e.g. 64): a factor model with a MultivariateNormal "
        "likelihood over 100 rows hung at 500 draws per chunk and ran at 100.",
        UHALinalgHangWarning,
        stacklevel=4,
    )
    return True


__all__ = ["UHALinalgHangWarning", "affected", "warn_if_linalg_may_hang"]
