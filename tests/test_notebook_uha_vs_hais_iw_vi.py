"""Executes notebooks/uha_vs_hais_iw_vi.ipynb top to bottom (see notebook_runner.py)."""

import pytest

from notebook_runner import run_notebook

# Marked slow (about 85 s) to keep the default suite near 10 minutes on 2 cores;
# run with `pytest -m slow` (and `python notebooks/run_all.py` re-executes it).
pytestmark = pytest.mark.slow


def test_uha_vs_hais_iw_vi_notebook_runs(tmp_path):
    run_notebook("uha_vs_hais_iw_vi.ipynb", tmp_path)
