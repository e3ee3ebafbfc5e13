"""Smoke run of `python -m benchmarks.warm_start_rounds --smoke` (see benchmark_smoke.py)."""

import pytest
from benchmark_smoke import run_smoke


# Marked slow to keep the default suite near 10 minutes on 2 cores: the rounds are
# tested in tests/core/test_vi_rounds.py.
@pytest.mark.slow
def test_warm_start_rounds_smoke(tmp_path):
    run_smoke("warm_start_rounds", tmp_path)
