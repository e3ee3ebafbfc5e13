"""Smoke run of `python -m benchmarks.local_globals --smoke` (see benchmark_smoke.py)."""

import json

import pytest

from benchmark_smoke import run_smoke


# Marked slow (45 s on 2 cores: NUTS and two fits) to keep the default suite near 10
# minutes; run with `pytest -m slow`.
@pytest.mark.slow
def test_local_globals_smoke(tmp_path):
    run_smoke("local_globals", tmp_path)
    payload = json.loads((tmp_path / "smoke.json").read_text())
    (regime,) = payload["regimes"]
    exact = regime["exact"]
    # the quadrature's posterior and NUTS's agree on mu (NUTS: 50 draws, loosely)
    assert abs(regime["nuts"]["mu"] - exact["mu"]) < 4 * exact["mu_sd"]
    # the best mean-field bound is a lower bound on log Z
    assert exact["mean_field_bound"] <= exact["log_z"]
    assert [r["coordinates"] for r in regime["rows"]] == ["centered", "non-centered"]
    for row in regime["rows"]:
        assert row["elbo"] == row["elbo"] and row["elbo_se"] >= 0  # not NaN
    assert "| 1 | non-centered | 0 |" in (tmp_path / "smoke.md").read_text()
