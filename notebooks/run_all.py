"""Re-execute the tutorial notebooks and save them with their outputs.

Run from anywhere, with the project's environment (it needs ``nbclient``, ``nbformat`` and
``ipykernel``, all in the ``test`` extra)::

    python notebooks/run_all.py                     # every notebook in this folder
    python notebooks/run_all.py quickstart.ipynb    # only some

Each notebook runs in a fresh kernel on *this* interpreter, with ``notebooks/`` as its
working directory, and is written back in place. The test suite
(``tests/test_notebook_*.py``) uses :func:`execute_notebook` too, without writing back.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

NOTEBOOK_DIR = Path(__file__).resolve().parent

#: Seconds any one cell may run before the execution fails.
CELL_TIMEOUT = 300


def notebook_paths() -> list[Path]:
    """Every tutorial notebook, sorted by name."""
    return sorted(NOTEBOOK_DIR.glob("*.ipynb"))


def _kernel_env(extra_env=None) -> dict:
    # The kernels read the logistic-regression data from the package's own copy (or from
    # NUMPYRO_UHA_DATA_DIR, if the caller set it), whatever the working directory.
    env = dict(os.environ)
    env.update(extra_env or {})
    return env


def _kernel_manager():
    """A kernel manager whose ``python3`` kernel is ipykernel on ``sys.executable``.

    A user-level ``python3`` kernelspec (``~/.local/share/jupyter``) would otherwise win
    and could point at another interpreter.
    """
    from ipykernel.kernelspec import RESOURCES, get_kernel_dict
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    class ThisInterpreter(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            return self.kernel_spec_class(resource_dir=RESOURCES, **get_kernel_dict())

    return KernelManager(kernel_name="python3", kernel_spec_manager=ThisInterpreter())


def execute_notebook(path, timeout: int = CELL_TIMEOUT, extra_env=None):
    """Execute the notebook at ``path`` in a fresh kernel; ``(notebook, seconds)``.

    ``extra_env`` adds environment variables for the kernel. Raises
    ``nbclient.exceptions.CellExecutionError`` at the first cell that fails. The file
    itself is not modified.
    """
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(str(path), as_version=4)
    client = NotebookClient(
        nb,
        km=_kernel_manager(),
        timeout=timeout,
        record_timing=False,
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
    )
    start = time.perf_counter()
    client.execute(env=_kernel_env(extra_env))
    return nb, time.perf_counter() - start


def main(argv=None) -> int:
    import nbformat

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="*", help="notebook file names (default: all)")
    parser.add_argument("--timeout", type=int, default=CELL_TIMEOUT, help="seconds per cell")
    args = parser.parse_args(argv)
    paths = [NOTEBOOK_DIR / Path(name).name for name in args.notebooks] or notebook_paths()
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        parser.error(f"no such notebook(s): {', '.join(missing)}")
    for path in paths:
        print(f"{path.name}: running...", flush=True)
        nb, seconds = execute_notebook(path, args.timeout)
        nbformat.write(nb, str(path))
        print(f"{path.name}: done in {seconds:.0f} s, saved with outputs", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
