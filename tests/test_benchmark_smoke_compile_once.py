"""Smoke run of `python -m benchmarks.compile_once --smoke` (see benchmark_smoke.py)."""

import pytest

from benchmark_smoke import run_smoke


# Marked slow (compiles every evaluation function of a GP model) to keep the default
# suite near 10 minutes on 2 cores; run with `pytest -m slow`.
@pytest.mark.slow
def test_compile_once_smoke(tmp_path):
    run_smoke("compile_once", tmp_path)
