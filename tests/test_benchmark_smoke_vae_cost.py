"""Smoke run of `python -m benchmarks.vae_cost --smoke` (see benchmark_smoke.py)."""

import json

import pytest

from benchmark_smoke import run_smoke


# Marked slow (16 s on 2 cores: it compiles the unrolled training steps) to keep the
# default suite near 10 minutes; run with `pytest -m slow`.
@pytest.mark.slow
def test_vae_cost_smoke(tmp_path):
    run_smoke("vae_cost", tmp_path)
    rows = json.loads((tmp_path / "smoke.json").read_text())["rows"]
    assert [r["K"] for r in rows] == [1, 2]
    # every transition counted (XLA counts a loop body once: the scans are unrolled)
    assert rows[1]["uha_chain_gflop"] > 1.3 * rows[0]["uha_chain_gflop"]
    row = rows[1]
    # a training step costs more than the chain's forward pass, which costs something
    assert 0 < row["uha_chain_gflop"] < row["uha_gflop"]
    assert row["iwae_gflop"] > 0 and row["iwae_step_s"] > 0 and row["uha_step_s"] > 0
    assert row["flop_ratio"] == row["uha_gflop"] / row["iwae_gflop"]
    assert "| 1 |" in (tmp_path / "smoke.md").read_text() and "| 2 |" in (tmp_path / "smoke.md").read_text()
