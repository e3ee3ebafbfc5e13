"""Smoke run of `python -m benchmarks.correlated_effects --smoke` (see benchmark_smoke.py)."""

import json

import pytest

from benchmark_smoke import run_smoke


# Marked slow (NUTS and two guides' set-up, about a minute on 2 cores) to keep the
# default suite near 10 minutes; run with `pytest -m slow`.
@pytest.mark.slow
def test_correlated_effects_smoke(tmp_path):
    run_smoke("correlated_effects", tmp_path)
    payload = json.loads((tmp_path / "smoke.json").read_text())
    regime = payload["regimes"]["weak"]
    assert [r["decenter"] for r in regime["rows"]] == ["False", "auto"]
    fixed, auto = regime["rows"]
    assert fixed["decentered_sites"] == [] and fixed["start_elbos"] is None
    # "auto" warm-started both coordinate systems, and ran the one whose start is higher
    starts = auto["start_elbos"]
    kept_non_centered = starts["non_centered"] > starts["as_written"]
    assert (auto["decentered_sites"] == ["ab"]) == kept_non_centered
    for row in regime["rows"]:
        assert row["elbo"] == row["elbo"] and len(row["sd"]["tau"]) == 2  # not NaN
    assert "| auto | 0 |" in (tmp_path / "smoke.md").read_text()
