"""Smoke run of `python -m benchmarks.applied_models --smoke` (see benchmark_smoke.py)."""

import pytest
from benchmark_smoke import run_smoke


# Marked slow to keep the default suite near 10 minutes on 2 cores: the script fits the
# guides with SVI and draws, as the guide tests do, and runs NUTS.
@pytest.mark.slow
def test_applied_models_smoke(tmp_path):
    run_smoke("applied_models", tmp_path)
