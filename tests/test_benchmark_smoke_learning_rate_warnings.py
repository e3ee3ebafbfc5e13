"""Smoke run of `python -m benchmarks.learning_rate_warnings --smoke` (see benchmark_smoke.py)."""

import pytest
from benchmark_smoke import run_smoke


# Marked slow (NUTS and a UHA fit in a fresh process) to keep the default suite short on
# 2 cores; `compare_with_nuts`, which it calls, is tested in tests/test_nuts_comparison.py.
@pytest.mark.slow
def test_learning_rate_warnings_smoke(tmp_path):
    run_smoke("learning_rate_warnings", tmp_path)
