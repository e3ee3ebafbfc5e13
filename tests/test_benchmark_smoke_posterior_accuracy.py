"""Smoke run of `python -m benchmarks.posterior_accuracy --smoke` (see benchmark_smoke.py)."""

import pytest

from benchmark_smoke import run_smoke


# Marked slow (about 70 s) to keep the default suite near 10 minutes on 2 cores;
# run with `pytest -m slow`.
@pytest.mark.slow
def test_posterior_accuracy_smoke(tmp_path):
    run_smoke("posterior_accuracy", tmp_path)
