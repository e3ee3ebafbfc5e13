"""Smoke run of `python -m benchmarks.draw_overhead --smoke` (see benchmark_smoke.py)."""

import pytest

from benchmark_smoke import run_smoke


# Marked slow (it starts fresh Python processes or compiles a chain per batch size) to
# keep the default suite short on 2 cores; run with `pytest -m slow`.
@pytest.mark.slow
def test_draw_overhead_smoke(tmp_path):
    run_smoke("draw_overhead", tmp_path)
