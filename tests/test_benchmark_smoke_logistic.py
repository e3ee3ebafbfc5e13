"""Smoke run of `python -m benchmarks.logistic --smoke` (see benchmark_smoke.py)."""

from benchmark_smoke import run_smoke


def test_logistic_smoke(tmp_path):
    run_smoke("logistic", tmp_path)
