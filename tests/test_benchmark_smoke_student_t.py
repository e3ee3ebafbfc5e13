"""Smoke run of `python -m benchmarks.student_t --smoke`: tiny sizes, keeps the benchmark alive.

It runs as a user would run it, in a subprocess, with XLA's backend optimizations off:
compilation dominates at these sizes, and the smoke run checks that the code runs and
writes its results, not what it measures.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from numpyro_uha.datasets import resolve_data_dir

ROOT = Path(__file__).resolve().parents[1]
NEEDS_DATA = bool(0)


@pytest.mark.skipif(
    NEEDS_DATA and not (resolve_data_dir() / "sonar.npz").is_file(),
    reason="benchmark data directory not present",
)
# Marked slow to keep the default suite near 10 minutes on 2 cores: the calls this script
# makes (plain VI, RenyiELBO, UHAGuide with frozen groups and init_from, AutoDAIS from a VI
# start, guide_log_weights) are all exercised by the logistic benchmark's smoke test.
@pytest.mark.slow
def test_student_t_smoke(tmp_path):
    env = dict(os.environ, NUMPYRO_UHA_RESULTS_DIR=str(tmp_path), NUMPYRO_UHA_DATA_DIR=str(resolve_data_dir()))
    env["XLA_FLAGS"] = " ".join(filter(None, [env.get("XLA_FLAGS"), "--xla_backend_optimization_level=0"]))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.student_t", "--smoke", "--name", "smoke"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    payload = json.loads((tmp_path / "smoke.json").read_text())
    assert payload["environment"]["versions"]["numpyro"]
    assert payload["environment"]["command"].startswith("python -m benchmarks.student_t")
    assert (tmp_path / "smoke.md").read_text().startswith("# smoke")
