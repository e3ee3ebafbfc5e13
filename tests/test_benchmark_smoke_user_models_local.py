"""Smoke run of `python -m benchmarks.user_models_local --smoke` (see benchmark_smoke.py)."""

import json

import pytest

from benchmark_smoke import run_smoke


# Marked slow (14 s on 2 cores) to keep the default suite near 10 minutes; run with
# `pytest -m slow`.
@pytest.mark.slow
def test_user_models_local_smoke(tmp_path):
    run_smoke("user_models_local", tmp_path)
    rows = json.loads((tmp_path / "smoke.json").read_text())["rows"]
    assert [r["guide"] for r in rows] == ["AutoNormal", "UHALocalGuide(K=8)"]
    assert all(r["predictive_ok"] and r["elbo"] == r["elbo"] for r in rows)
