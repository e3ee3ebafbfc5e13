"""Smoke run of `python -m benchmarks.reference_log_z --smoke` (see benchmark_smoke.py)."""

import pytest

from benchmark_smoke import run_smoke


# Marked slow (a benchmark's smoke run, about 20 s on 2 cores) to keep the default suite
# short; run with `pytest -m slow`.
@pytest.mark.slow
def test_reference_log_z_smoke(tmp_path):
    run_smoke("reference_log_z", tmp_path)
