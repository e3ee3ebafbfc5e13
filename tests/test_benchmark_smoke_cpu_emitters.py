"""Smoke run of `python -m benchmarks.cpu_emitters --smoke` (see benchmark_smoke.py)."""

import pytest

from benchmark_smoke import run_smoke


# Marked slow (it starts two fresh Python processes, each compiling a guide's setup and
# step with no cache) to keep the default suite short on 2 cores; run with `pytest -m slow`.
@pytest.mark.slow
def test_cpu_emitters_smoke(tmp_path):
    run_smoke("cpu_emitters", tmp_path)
