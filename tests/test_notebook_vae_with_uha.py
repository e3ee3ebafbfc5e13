"""Executes notebooks/vae_with_uha.ipynb top to bottom (see notebook_runner.py)."""

from notebook_runner import run_notebook


def test_vae_with_uha_notebook_runs(tmp_path):
    run_notebook("vae_with_uha.ipynb", tmp_path)
