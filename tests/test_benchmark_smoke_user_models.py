"""Smoke run of `python -m benchmarks.user_models --smoke` (see benchmark_smoke.py)."""

import pytest
from benchmark_smoke import run_smoke


# Marked slow to keep the default suite near 10 minutes on 2 cores: what the script calls
# (AutoNormal, UHAGuide with decenter="auto" choosing between two warm starts, and
# decenter=False, then evaluation.log_z) is covered by tests/test_decenter.py and the
# evaluation tests.
@pytest.mark.slow
def test_user_models_smoke(tmp_path):
    run_smoke("user_models", tmp_path)
