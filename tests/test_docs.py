"""The documentation builds, and every Python example in it runs.

* ``mkdocs build --strict`` fails on a broken link, a missing page, a broken snippet
  include or an API reference (``::: numpyro_uha...`` or a cross-reference in a docstring)
  that no longer resolves.
* Every ```` ```python ```` block of ``README.md`` and ``docs/**/*.md`` is executed, page
  by page: a page's blocks run in order in one fresh namespace, like a doctest session.
  A block right after ``<!-- skip-test -->`` is not run (for the rare sketch that cannot
  run on its own); everything else must. A page whose examples are exactly those of a page
  run before it (the home page repeats the README's) is not run twice.
* The examples run as on a fresh machine: in an empty working directory (no checkout or
  data folder around it), with ``NUMPYRO_UHA_DATA_DIR`` unset, so the datasets they load
  must come from the installed package itself.
* The README's two set-up commands are the CI command and the demo command.

The examples use small models and step counts, and JAX compilation dominates their run
time. So the pages run in two helper processes (one import of JAX each, in parallel) with
XLA's backend optimizations off and a persistent compilation cache shared by the pages;
neither changes what the examples compute beyond floating-point rounding. Each page still
gets a fresh namespace, and its test reports its own failure.
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SKIP_MARKER = "<!-- skip-test -->"
PAGE_TIMEOUT_S = 300
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
    re.MULTILINE | re.DOTALL,
)


def _located_blocks(text: str, lang: str) -> list[tuple[int, str]]:
    """``(first line number, body)`` of each ``lang`` code block of Markdown ``text``."""
    found = []
    for match in FENCE.finditer(text):
        if match.group("lang") != lang:
            continue
        if text[: match.start()].rstrip().endswith(SKIP_MARKER):
            continue
        indent, body = match.group("indent"), match.group("body")
        if indent:
            body = "".join(
                line[len(indent):] if line.startswith(indent) else line
                for line in body.splitlines(keepends=True)
            )
        found.append((text.count("\n", 0, match.start("body")) + 1, body))
    return found


def _blocks(text: str, lang: str) -> list[str]:
    """Bodies of the ``lang`` code blocks of Markdown ``text``, in order, skips removed."""
    return [body for _, body in _located_blocks(text, lang)]


def _python_blocks(page: Path) -> list[str]:
    return _blocks(page.read_text(encoding="utf-8"), "python")


def _page_id(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def _pages_to_run() -> list[Path]:
    pages, seen = [], set()
    for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        blocks = tuple(_python_blocks(page))
        if blocks and blocks not in seen:
            seen.add(blocks)
            pages.append(page)
    return pages


PAGES = _pages_to_run()

# Runs pages sent as JSON lines on stdin; answers one JSON line per page on stdout. The
# examples' own output is captured and sent back, so that a failure shows it.
KERNEL = r"""
import contextlib, io, json, sys, traceback

for line in sys.stdin:
    request = json.loads(line)
    output = io.StringIO()
    namespace = {"__name__": request["module"]}
    reply = {"ok": True}
    try:
        with contextlib.redirect_stdout(output):
            for label, source in request["blocks"]:
                exec(compile(source, label, "exec"), namespace)
    except BaseException:
        reply = {"ok": False, "error": traceback.format_exc()}
    reply["output"] = output.getvalue()
    sys.__stdout__.write(json.dumps(reply) + "\n")
    sys.__stdout__.flush()
"""


class Kernel:
    """One Python process that executes documentation pages, each in a fresh namespace."""

    def __init__(self, workdir: Path, cache_dir: Path, timeout_s: float = PAGE_TIMEOUT_S):
        self.timeout_s = timeout_s
        workdir.mkdir(parents=True, exist_ok=True)
        self.stderr_path = workdir / "stderr.txt"
        cwd = workdir / "cwd"
        cwd.mkdir(exist_ok=True)
        env = dict(os.environ)
        env.pop("NUMPYRO_UHA_DATA_DIR", None)
        env["XLA_FLAGS"] = " ".join(
            filter(None, [env.get("XLA_FLAGS"), "--xla_backend_optimization_level=0"])
        )
        env["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir)
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
        env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
        env["MPLBACKEND"] = "Agg"
        with open(self.stderr_path, "wb") as stderr:
            # An empty working directory with nothing beside it: the examples must not
            # depend on where they are run from (the datasets are package data).
            self.process = subprocess.Popen(
                [sys.executable, "-u", "-c", KERNEL],
                cwd=cwd,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self.requests: queue.Queue[str] = queue.Queue()
        self.replies: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._write, daemon=True).start()
        threading.Thread(target=self._read, daemon=True).start()

    def submit(self, page: Path) -> None:
        """Queue ``page``; a writer thread feeds the process, so a full pipe cannot block."""
        # Padding each block with blank lines makes tracebacks give the page's line numbers.
        blocks = [
            (_page_id(page), "\n" * (line - 1) + source)
            for line, source in _located_blocks(page.read_text(encoding="utf-8"), "python")
        ]
        module = "docs_example_" + re.sub(r"\W", "_", page.stem)
        self.requests.put(json.dumps({"module": module, "blocks": blocks}) + "\n")

    def _write(self) -> None:
        try:
            while True:
                self.process.stdin.write(self.requests.get())
                self.process.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # the process died; reading its reply reports why

    def _read(self) -> None:
        """Move each reply line into ``self.replies``; ``None`` once the process exits.

        A reader thread, not ``select`` on the pipe followed by ``readline``: the buffered
        ``readline`` can take several replies off the pipe at once, and a ``select`` for
        the next one then waits on an empty pipe for a reply already read (a kernel that
        ran ahead of the tests looked hung for the full timeout).
        """
        for line in self.process.stdout:
            self.replies.put(line)
        self.replies.put(None)

    def next_reply(self) -> dict:
        """The reply to the oldest page not yet answered."""
        try:
            line = self.replies.get(timeout=self.timeout_s)
        except queue.Empty:
            line, reason = None, f"took longer than {self.timeout_s:g} s"
        else:
            reason = "exited"
        if line:
            return json.loads(line)
        self.close()
        stderr = self.stderr_path.read_text(errors="replace")[-5000:]
        return {"ok": False, "error": f"the example process {reason}:\n{stderr}", "output": ""}

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class PageRunner:
    """Runs pages on a few kernels in parallel; tests collect the replies.

    Pages that fit the same dataset run in the same kernel, one after the other, so that
    the later ones find their compiled programs in the persistent cache. Groups go to the
    least-loaded kernel, heaviest first (SVI runs dominate the cost: they compile). With
    ``prefetch`` every page is queued at once, in test order; otherwise a page is queued
    when its test asks for it.
    """

    def __init__(self, workdir: Path, pages: list[Path], num_kernels: int, prefetch: bool):
        # the suite's cache (tests/conftest.py) where it has one: programs the tests
        # compiled before are read back
        cache_dir = os.environ.get("JAX_COMPILATION_CACHE_DIR") or workdir / "jax-cache"
        self.kernels = [Kernel(workdir / f"kernel-{i}", cache_dir) for i in range(num_kernels)]
        groups: dict[str, list[Path]] = {}
        for page in pages:
            groups.setdefault(_dataset(page), []).append(page)
        load = [0] * num_kernels
        self.kernel_of = {}
        for group in sorted(groups.values(), key=lambda g: -sum(map(_cost, g))):
            index = load.index(min(load))
            load[index] += sum(map(_cost, group))
            self.kernel_of.update((page, index) for page in group)
        self.queues = [[] for _ in range(num_kernels)]
        self.replies = {}
        if prefetch:
            for page in pages:
                self._submit(page)

    def _submit(self, page: Path) -> None:
        index = self.kernel_of[page]
        self.queues[index].append(page)
        self.kernels[index].submit(page)

    def result(self, page: Path) -> dict:
        index = self.kernel_of[page]
        if page not in self.replies and page not in self.queues[index]:
            self._submit(page)
        while page not in self.replies:
            self.replies[self.queues[index].pop(0)] = self.kernels[index].next_reply()
        return self.replies[page]

    def close(self) -> None:
        for kernel in self.kernels:
            kernel.close()


def _dataset(page: Path) -> str:
    match = re.search(r'load_logistic_regression\("(\w+)"\)', page.read_text(encoding="utf-8"))
    return match.group(1) if match else ""


def _cost(page: Path) -> int:
    return 1 + 4 * page.read_text(encoding="utf-8").count(".run(")


@pytest.fixture(scope="module")
def pages(request, tmp_path_factory):
    selected = [
        item.callspec.params["page"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_examples_run"
    ]
    # Queue all selected pages at once only where this process runs all of them: without
    # xdist, or with a distribution that keeps a file's tests on one worker.
    try:
        dist = request.config.getoption("dist")
    except ValueError:
        dist = "no"
    runner = PageRunner(
        tmp_path_factory.mktemp("docs-examples"),
        selected,
        num_kernels=min(2, os.cpu_count() or 1),
        prefetch=dist in ("no", "loadfile", "loadscope"),
    )
    yield runner
    runner.close()


def test_pages_are_collected():
    # An empty glob would make the example tests pass vacuously.
    assert ROOT / "README.md" in PAGES
    assert DOCS / "getting-started.md" in PAGES
    assert len(PAGES) >= 5


def test_home_page_example_is_the_readme_example():
    assert _python_blocks(DOCS / "index.md") == _python_blocks(ROOT / "README.md")


def test_kernel_returns_replies_that_arrived_together(tmp_path, monkeypatch):
    # Both pages are answered before the first reply is read: the second reply must come
    # at once, not after the timeout (a buffered readline took both off the pipe, and a
    # select for the second then waited on an empty pipe: khat.md "hung" in CI).
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    marker = tmp_path / "second-page-ran"
    first, second = tmp_path / "first.md", tmp_path / "second.md"
    first.write_text("```python\nprint('first')\n```\n", encoding="utf-8")
    second.write_text(
        f"```python\nprint('second')\nopen({str(marker)!r}, 'w').close()\n```\n",
        encoding="utf-8",
    )
    kernel = Kernel(tmp_path / "kernel", tmp_path / "cache", timeout_s=20)
    try:
        kernel.submit(first)
        kernel.submit(second)
        for _ in range(200):
            if marker.exists():
                break
            time.sleep(0.05)
        time.sleep(0.5)  # the second reply is written right after the marker
        assert marker.exists()
        replies = [kernel.next_reply() for _ in range(2)]
    finally:
        kernel.close()
    assert [reply["output"] for reply in replies] == ["first\n", "second\n"], replies


# Pages whose examples take 20 s or more on 2 cores (as measured in a full run, session of
# 2026-11-29: 21-64 s each) run with `pytest -m slow`, to keep the default suite near 10
# minutes (more below).
SLOW_PAGES = {
    "docs/how-to/divergence-and-saving.md",
    "docs/how-to/log-z.md",
    "docs/how-to/compare-nuts.md",
    "docs/how-to/predict.md",
    "docs/how-to/extrapolate-k.md",
    # 25-40 s; its code paths are in the default suite (tests/test_enumerate.py)
    "docs/how-to/discrete.md",
    # 34 s on a slower 2-core machine (2026-11-30); its sharding and device paths are in
    # the default suite (tests/test_sharding.py)
    "docs/how-to/devices.md",
    # 35-96 s each in a full run on the 2-core CPU (2026-11-30, ~40 min of test time in
    # all): the pages' guides, options and estimators are tested by default in their own
    # test files; the README's examples stay in the default suite
    "docs/getting-started.md",
    "docs/how-to/local-latents.md",
    "docs/how-to/khat.md",
    "docs/how-to/freeze-groups.md",
    "docs/how-to/warm-start.md",  # 29 s (second round)
}


def test_slow_pages_exist():
    assert SLOW_PAGES <= {_page_id(page) for page in PAGES}


@pytest.mark.parametrize(
    "page",
    [pytest.param(page, marks=pytest.mark.slow) if _page_id(page) in SLOW_PAGES else page
     for page in PAGES],
    ids=_page_id,
)
def test_examples_run(page: Path, pages):
    reply = pages.result(page)
    assert reply["ok"], f"{_page_id(page)}:\n{reply['error']}\nOutput so far:\n{reply['output']}"


def test_site_builds_strict(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    for page in ("index.html", "api/guide/index.html", "how-to/log-z/index.html"):
        assert (tmp_path / "site" / page).is_file(), page


def test_readme_setup_commands():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    setup = re.search(r"^## Set-up$(.*?)(?=^## )", readme, re.MULTILINE | re.DOTALL)
    assert setup, "README.md has no '## Set-up' section"
    commands = [block.strip() for block in _blocks(setup.group(1), "bash")]
    ci_command = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ][-1]
    assert len(commands) == 2, commands
    demo, test = commands
    assert test == ci_command
    assert demo == "python3.11 -m venv .venv && .venv/bin/pip install -q . && .venv/bin/python -m numpyro_uha.demo"
