"""Executes notebooks/uha_vs_hais_iw_vi.ipynb top to bottom (see notebook_runner.py)."""

from notebook_runner import requires_dataset, run_notebook

pytestmark = requires_dataset("ionosphere")


def test_uha_vs_hais_iw_vi_notebook_runs(tmp_path):
    run_notebook("uha_vs_hais_iw_vi.ipynb", tmp_path)
