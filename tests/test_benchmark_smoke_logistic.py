"""Smoke run of `python -m benchmarks.logistic --smoke` (see benchmark_smoke.py)."""

from benchmark_smoke import requires_data, run_smoke


@requires_data
def test_logistic_smoke(tmp_path):
    run_smoke("logistic", tmp_path)
