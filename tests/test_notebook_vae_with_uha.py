"""Executes notebooks/vae_with_uha.ipynb top to bottom (see notebook_runner.py)."""

import pytest

from notebook_runner import run_notebook

# Marked slow (about 36 s on 2 cores) to keep the default suite near 10 minutes on 2 cores;
# run with `pytest -m slow` (and `python notebooks/run_all.py` re-executes it).
pytestmark = pytest.mark.slow


def test_vae_with_uha_notebook_runs(tmp_path):
    run_notebook("vae_with_uha.ipynb", tmp_path)
