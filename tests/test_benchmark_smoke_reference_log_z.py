"""Smoke run of `python -m benchmarks.reference_log_z --smoke` (see benchmark_smoke.py)."""

from benchmark_smoke import run_smoke


def test_reference_log_z_smoke(tmp_path):
    run_smoke("reference_log_z", tmp_path)
