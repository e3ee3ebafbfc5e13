"""Executes notebooks/log_z_model_comparison.ipynb top to bottom (see notebook_runner.py)."""

import pytest

from notebook_runner import run_notebook

# Marked slow (about 45-75 s) to keep the default suite near 10 minutes on 2 cores;
# run with `pytest -m slow` (and `python notebooks/run_all.py` re-executes it).
pytestmark = pytest.mark.slow


def test_log_z_model_comparison_notebook_runs(tmp_path):
    run_notebook("log_z_model_comparison.ipynb", tmp_path)
