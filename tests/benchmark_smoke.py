"""Shared by ``tests/test_benchmark_smoke_*.py``: run ``python -m benchmarks.<name> --smoke``.

Each benchmark has its own small test file so that pytest-xdist (``--dist loadfile``)
spreads them over the workers. The script runs as a user would run it, in a subprocess,
with XLA's backend optimizations off: compilation dominates at these sizes, and the smoke
run checks that the code runs and writes its results, not what it measures.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_smoke(name: str, tmp_path: Path) -> None:
    env = dict(os.environ, NUMPYRO_UHA_RESULTS_DIR=str(tmp_path))
    # The benchmarks read the package's own copy of the datasets, as on a fresh machine.
    env.pop("NUMPYRO_UHA_DATA_DIR", None)
    env["XLA_FLAGS"] = " ".join(filter(None, [env.get("XLA_FLAGS"), "--xla_backend_optimization_level=0"]))
    proc = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", "--smoke", "--name", "smoke"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    payload = json.loads((tmp_path / "smoke.json").read_text())
    assert payload["environment"]["versions"]["numpyro"]
    assert payload["environment"]["command"].startswith(f"python -m benchmarks.{name}")
    assert (tmp_path / "smoke.md").read_text().startswith("# smoke")
