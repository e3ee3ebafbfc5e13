"""Smoke run of `python -m benchmarks.inference_gym_ports --smoke` (see benchmark_smoke.py)."""

import pytest

from benchmark_smoke import run_smoke


# Marked slow (a benchmark's smoke run, about 20 s on 2 cores) to keep the default suite
# short; run with `pytest -m slow`.
@pytest.mark.slow
def test_inference_gym_ports_smoke(tmp_path):
    run_smoke("inference_gym_ports", tmp_path)
