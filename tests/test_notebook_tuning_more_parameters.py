"""Executes notebooks/tuning_more_parameters.ipynb top to bottom (see notebook_runner.py)."""

from notebook_runner import run_notebook


def test_tuning_more_parameters_notebook_runs(tmp_path):
    run_notebook("tuning_more_parameters.ipynb", tmp_path)
