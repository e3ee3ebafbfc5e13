"""Executes notebooks/log_z_model_comparison.ipynb top to bottom (see notebook_runner.py)."""

from notebook_runner import run_notebook


def test_log_z_model_comparison_notebook_runs(tmp_path):
    run_notebook("log_z_model_comparison.ipynb", tmp_path)
