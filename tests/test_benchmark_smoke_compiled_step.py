"""Smoke run of `python -m benchmarks.compiled_step --smoke` (see benchmark_smoke.py)."""

from benchmark_smoke import run_smoke


def test_compiled_step_smoke(tmp_path):
    run_smoke("compiled_step", tmp_path)
