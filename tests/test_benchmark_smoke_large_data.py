"""Smoke run of `python -m benchmarks.large_data --smoke` (see benchmark_smoke.py)."""

import pytest

from benchmark_smoke import run_smoke


# Marked slow (it starts seven fresh Python processes) to keep the default suite short
# on 2 cores; run with `pytest -m slow`.
@pytest.mark.slow
def test_large_data_smoke(tmp_path):
    run_smoke("large_data", tmp_path)
