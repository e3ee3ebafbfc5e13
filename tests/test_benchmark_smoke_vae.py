"""Smoke run of `python -m benchmarks.vae --smoke` (= `--quick`, digits; see benchmark_smoke.py)."""

import json

import pytest

from benchmark_smoke import run_smoke


# Marked slow: 25-40 s on 2 cores (mostly compiling the VAE, IWAE, two UHA, forward and
# reverse AIS programs, with XLA's backend optimizations off); run with `pytest -m slow`.
@pytest.mark.slow
def test_vae_smoke(tmp_path):
    run_smoke("vae", tmp_path)
    payload = json.loads((tmp_path / "smoke.json").read_text())
    assert [(r["method"], r["K"]) for r in payload["rows"]] == [
        ("vae", 1), ("iwae", 4), ("uha", 4), ("uha_enc", 4)
    ]
    for row in payload["rows"]:
        for key in ("test_elbo", "test_elbo_se", "test_bound", "test_log_lik", "test_log_lik_se",
                    "gap", "per_epoch_s"):
            assert isinstance(row[key], float), (key, row[key])
    for row in payload["rows"][2:]:
        for key in ("q_elbo", "test_is_log_lik", "time_vs_iwae"):
            assert isinstance(row[key], float), (key, row[key])
        assert row["test_elbo"] == row["test_bound"]  # the UHA bound is the row's ELBO
    assert [(c["method"], c["K"]) for c in payload["comparison"]] == [("uha", 4), ("uha_enc", 4)]
    assert payload["bdmc"] and all(r["upper"] == r["upper"] for r in payload["bdmc"])  # not NaN
    assert len(payload["bdmc"]) == 4
    md = (tmp_path / "smoke.md").read_text()
    for line in ("| IWAE | 4 |", "| UHA | 4 |", "| UHA+enc | 4 |"):
        assert line in md
