"""Smoke run of `python -m benchmarks.full_rank_cost --smoke` (see benchmark_smoke.py)."""

import pytest
from benchmark_smoke import run_smoke


# Marked slow to keep the default suite near 10 minutes on 2 cores: its calls (UHAGuide
# with base_dist "diagonal" and "cholesky", a jitted svi.update, svi.run, weighted draws)
# are the default suite's elsewhere, and test_benchmarks_import covers its names.
@pytest.mark.slow
def test_full_rank_cost_smoke(tmp_path):
    run_smoke("full_rank_cost", tmp_path)
