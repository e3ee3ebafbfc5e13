"""Every benchmark module imports, and every benchmark the device scripts run exists.

The benchmarks' smoke runs are slow (marked ``slow``, run on demand), so a name moved
in the package or in ``benchmarks/common.py`` could break a benchmark unseen by the
default suite: ``benchmarks.draw_batch`` and ``benchmarks.draw_overhead`` imported a
helper renamed in ``benchmarks.speed`` and would have failed on the next machine lent a
GPU (``benchmarks/device_check_16.sh`` runs both). Importing is cheap; this catches that.
"""

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(
    p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "__init__"
)


@pytest.mark.parametrize("name", MODULES)
def test_the_benchmark_imports(name):
    module = importlib.import_module(f"benchmarks.{name}")
    assert module.__name__ == f"benchmarks.{name}"


def test_the_device_scripts_run_benchmarks_that_exist():
    scripts = sorted((ROOT / "benchmarks").glob("*.sh"))
    assert scripts
    named = {
        m for script in scripts
        for m in re.findall(r"-m benchmarks\.(\w+)", script.read_text())
    }
    assert named, "no benchmark found in the device scripts"
    assert named <= set(MODULES), sorted(named - set(MODULES))
