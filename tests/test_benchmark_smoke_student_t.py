"""Smoke run of `python -m benchmarks.student_t --smoke` (see benchmark_smoke.py)."""

import pytest
from benchmark_smoke import run_smoke


# Marked slow to keep the default suite near 10 minutes on 2 cores: the calls this script
# makes (plain VI, RenyiELBO, UHAGuide with frozen groups and init_from, AutoDAIS from a VI
# start, guide_log_weights) are all exercised by the logistic benchmark's smoke test.
@pytest.mark.slow
def test_student_t_smoke(tmp_path):
    run_smoke("student_t", tmp_path)
