"""Executes notebooks/quickstart.ipynb top to bottom (see notebook_runner.py)."""

from notebook_runner import run_notebook


def test_quickstart_notebook_runs(tmp_path):
    run_notebook("quickstart.ipynb", tmp_path)
