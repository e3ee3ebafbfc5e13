"""Smoke run of `python -m benchmarks.local_globals --smoke` (see benchmark_smoke.py)."""

import json

import pytest

from benchmark_smoke import run_smoke


# Marked slow (about a minute on 2 cores: NUTS and fits) to keep the default suite near 10
# minutes; run with `pytest -m slow`.
@pytest.mark.slow
def test_local_globals_smoke(tmp_path):
    run_smoke("local_globals", tmp_path)
    payload = json.loads((tmp_path / "smoke.json").read_text())
    regime = payload["regimes"][0]
    exact = regime["exact"]
    # the quadrature's posterior and NUTS's agree on mu (NUTS: 50 draws, loosely)
    assert abs(regime["nuts"]["mu"] - exact["mu"]) < 4 * exact["mu_sd"]
    # the best mean-field bound is a lower bound on log Z
    assert exact["mean_field_bound"] <= exact["log_z"]
    rows = regime["rows"]
    assert [r["coordinates"] for r in rows] == ["centered", "decenter=True", "LocScaleReparam"]
    # the guide's non-centered chains are those of the user's LocScaleReparam model
    assert rows[1]["mu"] == pytest.approx(rows[2]["mu"], rel=1e-4)
    assert rows[1]["tau_sd"] == pytest.approx(rows[2]["tau_sd"], rel=1e-4)
    poisson = payload["regimes"][1]["poisson_mixed"]["rows"]
    assert [r["fit"] for r in poisson][1:] == ["centered", "decenter=True"]
    for row in regime["rows"]:
        assert row["elbo"] == row["elbo"] and row["elbo_se"] >= 0  # not NaN
    assert "| 1 | decenter=True | 0 |" in (tmp_path / "smoke.md").read_text()
