"""Smoke run of `python -m benchmarks.correlated_hunt --smoke` (see benchmark_smoke.py)."""

import pytest
from benchmark_smoke import run_smoke


# Marked slow to keep the default suite near 10 minutes on 2 cores: the benchmark's calls
# (UHAGuide's setup, svi.run, sample_posterior_with_log_weights, the zoo's moment check)
# are the default suite's elsewhere, and test_benchmarks_import covers its names.
@pytest.mark.slow
def test_correlated_hunt_smoke(tmp_path):
    run_smoke("correlated_hunt", tmp_path)
