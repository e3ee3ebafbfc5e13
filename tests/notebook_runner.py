"""Shared by ``tests/test_notebook_*.py``: execute one tutorial notebook, fail on any error.

Every notebook has its own small test file so that pytest-xdist (``--dist loadfile`` in
the project's ``addopts``) can run two notebooks at once; a parametrized test in one file
would keep them all on one worker. ``tests/test_notebooks.py`` checks that no notebook is
left without a test file.

A notebook runs in a fresh ipykernel on this interpreter, with ``notebooks/`` as its
working directory, through :func:`execute_notebook` of ``notebooks/run_all.py`` (the
script that refreshes the stored outputs). Nothing is written back. JAX compilation
dominates the notebooks' run time, so, as in ``test_docs.py``, the kernel runs with XLA's
backend optimizations off and a persistent compilation cache (identical programs compiled
twice in one notebook, such as the Hamiltonian AIS grid search's, are then compiled once);
neither changes what the notebooks compute beyond floating-point rounding.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
#: Seconds any one cell may run.
CELL_TIMEOUT_S = 300


def _run_all():
    spec = importlib.util.spec_from_file_location("notebooks_run_all", NOTEBOOK_DIR / "run_all.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_notebook(name: str, tmp_path: Path) -> None:
    """Execute ``notebooks/<name>``; a failing cell fails the test with its traceback."""
    from nbclient.exceptions import CellExecutionError

    env = {
        "XLA_FLAGS": " ".join(
            filter(None, [os.environ.get("XLA_FLAGS"), "--xla_backend_optimization_level=0"])
        ),
        # the suite's cache (tests/conftest.py) where it has one
        "JAX_COMPILATION_CACHE_DIR": os.environ.get("JAX_COMPILATION_CACHE_DIR")
        or str(tmp_path / "jax-cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }
    try:
        _run_all().execute_notebook(NOTEBOOK_DIR / name, CELL_TIMEOUT_S, extra_env=env)
    except CellExecutionError as err:
        pytest.fail(f"notebooks/{name}: a cell failed.\n{err}", pytrace=False)
