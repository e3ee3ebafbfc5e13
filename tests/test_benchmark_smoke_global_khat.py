"""Smoke runs of `python -m benchmarks.global_khat --smoke` and
`python -m benchmarks.global_log_z_calibration --smoke` (see benchmark_smoke.py)."""

import json

import pytest

from benchmark_smoke import run_smoke


# Marked slow (about 40 s on 2 cores: NUTS, a fit and global_log_z's compilation) to keep
# the default suite near 10 minutes; run with `pytest -m slow`.
@pytest.mark.slow
def test_global_khat_smoke(tmp_path):
    run_smoke("global_khat", tmp_path)
    payload = json.loads((tmp_path / "smoke.json").read_text())
    (row,) = payload["rows"]
    assert (row["model"], row["fit"], row["site"]) == ("normal_informed", "centered", "tau")
    (check,) = row["checks"]
    # 20 steps leave the guide far from the posterior: the weights say so
    assert check["warned"] and check["pareto_khat"] >= 0.7
    assert check["se"] >= check["chains_se"] > 0
    assert "| normal_informed | centered, 20 | tau " in (tmp_path / "smoke.md").read_text()


@pytest.mark.slow
def test_global_log_z_calibration_smoke(tmp_path):
    run_smoke("global_log_z_calibration", tmp_path)
    payload = json.loads((tmp_path / "smoke.json").read_text())
    (row,) = payload["rows"]
    assert (row["model"], row["num_samples"], len(row["log_z"])) == ("normal_informed", 4, 2)
    # 20 steps: far off, and it says so
    assert row["warned"] == 2 and all(s >= c for s, c in zip(row["se"], row["chains_se"]))
    assert "| normal_informed | centered, 20 | 4 |" in (tmp_path / "smoke.md").read_text()
