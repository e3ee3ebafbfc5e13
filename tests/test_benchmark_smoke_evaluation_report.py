"""Smoke run of `python -m benchmarks.evaluation_report --smoke` (see benchmark_smoke.py)."""

import pytest

from benchmark_smoke import run_smoke


# Marked slow (about 55 s) to keep the default suite near 10 minutes on 2 cores;
# run with `pytest -m slow`.
@pytest.mark.slow
def test_evaluation_report_smoke(tmp_path):
    run_smoke("evaluation_report", tmp_path)
