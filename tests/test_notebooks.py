"""The tutorial notebooks: every one is tested, indexed, and stored with its outputs.

The notebooks themselves are executed by ``tests/test_notebook_<name>.py``, one file per
notebook so that pytest-xdist runs them in parallel (see ``notebook_runner.py``). The
checks here are cheap and read the stored files only: the notebooks are meant to be read
on a code host, so they must be saved executed (``python notebooks/run_all.py``).
"""

from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found in notebooks/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_has_its_own_test_file(path):
    test_file = ROOT / "tests" / f"test_notebook_{path.stem}.py"
    assert test_file.is_file(), (
        f"{path.name} is not executed by the test suite: add {test_file.relative_to(ROOT)} "
        "(a copy of another tests/test_notebook_*.py with the name changed)."
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_listed_in_the_index(path):
    index = (ROOT / "notebooks" / "README.md").read_text(encoding="utf-8")
    assert path.name in index, f"notebooks/README.md does not list {path.name}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_executed_without_errors(path):
    nb = nbformat.read(str(path), as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    stale = [i for i, cell in enumerate(code) if cell.execution_count is None]
    assert not stale, (
        f"{path.name}: code cells {stale} were not executed; refresh with "
        "`python notebooks/run_all.py`."
    )
    counts = [cell.execution_count for cell in code]
    assert counts == list(range(1, len(code) + 1)), (
        f"{path.name} was not executed top to bottom in one run (execution counts {counts})."
    )
    errors = [o for cell in code for o in cell.outputs if o.output_type == "error"]
    assert not errors, f"{path.name} is stored with an error output: {errors[0].get('ename')}"
    figures = [o for cell in code for o in cell.outputs if "image/png" in o.get("data", {})]
    assert figures, f"{path.name} has no embedded figure"
