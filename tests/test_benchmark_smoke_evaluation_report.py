"""Smoke run of `python -m benchmarks.evaluation_report --smoke` (see benchmark_smoke.py)."""

from benchmark_smoke import requires_data, run_smoke


@requires_data
def test_evaluation_report_smoke(tmp_path):
    run_smoke("evaluation_report", tmp_path)
