"""Smoke run of `python -m benchmarks.local_precondition --smoke` (see benchmark_smoke.py)."""

import json

import pytest

from benchmark_smoke import run_smoke


# Marked slow (13 s on 2 cores) to keep the default suite near 10 minutes; run with
# `pytest -m slow`.
@pytest.mark.slow
def test_local_precondition_smoke(tmp_path):
    run_smoke("local_precondition", tmp_path)
    rows = json.loads((tmp_path / "smoke.json").read_text())["rows"]
    assert [(r["init_scale"], r["precondition"]) for r in rows] == [(0.1, False), (0.1, True)]
    for row in rows:
        assert row["elbo"] == row["elbo"] and row["elbo_se"] >= 0  # not NaN
    assert "| 0.1 | True |" in (tmp_path / "smoke.md").read_text()
