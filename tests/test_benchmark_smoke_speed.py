"""Smoke run of `python -m benchmarks.speed --smoke` (see benchmark_smoke.py)."""

from benchmark_smoke import run_smoke


def test_speed_smoke(tmp_path):
    run_smoke("speed", tmp_path)
