"""Smoke run of `python -m benchmarks.inference_gym_ports --smoke` (see benchmark_smoke.py)."""

from benchmark_smoke import run_smoke


def test_inference_gym_ports_smoke(tmp_path):
    run_smoke("inference_gym_ports", tmp_path)
