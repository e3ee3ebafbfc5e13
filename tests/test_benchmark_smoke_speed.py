"""Smoke run of `python -m benchmarks.speed --smoke` (see benchmark_smoke.py)."""

from benchmark_smoke import requires_data, run_smoke


@requires_data
def test_speed_smoke(tmp_path):
    run_smoke("speed", tmp_path)
