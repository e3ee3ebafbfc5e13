"""Smoke run of `python -m benchmarks.vae_gradients --smoke` (digits; see benchmark_smoke.py)."""

import json

import pytest

from benchmark_smoke import run_smoke


# Marked slow, as the VAE benchmark's smoke run: it trains a VAE and a UHA fit.
@pytest.mark.slow
def test_vae_gradients_smoke(tmp_path):
    run_smoke("vae_gradients", tmp_path)
    payload = json.loads((tmp_path / "smoke.json").read_text())
    (record,) = payload["epochs"]
    stats = record["decoder_gradient"]
    assert 0 < stats["median"] <= stats["p99"] <= stats["max"]
    assert record["steps_with_diverged_chains"] == 0
    assert "| 1 |" in (tmp_path / "smoke.md").read_text()
