"""Smoke run of `python -m benchmarks.speed --smoke` (see benchmark_smoke.py)."""

import pytest

from benchmark_smoke import run_smoke


# Marked slow (20-40 s) to keep the default suite near 10 minutes on 2 cores;
# run with `pytest -m slow`.
@pytest.mark.slow
def test_speed_smoke(tmp_path):
    run_smoke("speed", tmp_path)
