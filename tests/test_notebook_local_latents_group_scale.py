"""Executes notebooks/local_latents_group_scale.ipynb top to bottom (see notebook_runner.py)."""

import pytest

from notebook_runner import run_notebook

# Marked slow (about 60 s on 2 cores: two fits, NUTS and global_log_z) to keep the default
# suite near 10 minutes on 2 cores; run with `pytest -m slow` (and
# `python notebooks/run_all.py` re-executes it).
pytestmark = pytest.mark.slow


def test_local_latents_group_scale_notebook_runs(tmp_path):
    run_notebook("local_latents_group_scale.ipynb", tmp_path)
