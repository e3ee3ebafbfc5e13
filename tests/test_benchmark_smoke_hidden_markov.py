"""Smoke run of `python -m benchmarks.hidden_markov --smoke` (see benchmark_smoke.py)."""

import json

import pytest

from benchmark_smoke import run_smoke


# Marked slow, like the other benchmark smoke runs, to keep the default suite near 10
# minutes; run with `pytest -m slow`.
@pytest.mark.slow
def test_hidden_markov_smoke(tmp_path):
    run_smoke("hidden_markov", tmp_path)
    rows = json.loads((tmp_path / "smoke.json").read_text())["rows"]
    assert [r["model"] for r in rows] == ["two_state (60 steps)"]
    row = rows[0]
    assert all(row[k] == row[k] for k in ("exact_log_z", "iw_log_z", "forward_algorithm"))
    assert set(row["sites"]) == {"shift", "stay"}
