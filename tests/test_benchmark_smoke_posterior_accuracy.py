"""Smoke run of `python -m benchmarks.posterior_accuracy --smoke` (see benchmark_smoke.py)."""

from benchmark_smoke import requires_data, run_smoke


@requires_data
def test_posterior_accuracy_smoke(tmp_path):
    run_smoke("posterior_accuracy", tmp_path)
