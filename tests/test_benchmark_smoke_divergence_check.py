"""Smoke run of `python -m benchmarks.divergence_check --smoke` (see benchmark_smoke.py)."""

import pytest

from benchmark_smoke import run_smoke


# Marked slow (~20 s) to keep the default suite near 10 minutes on 2 cores;
# run with `pytest -m slow`.
@pytest.mark.slow
def test_divergence_check_smoke(tmp_path):
    run_smoke("divergence_check", tmp_path)
