"""The list of tests that the default suite leaves to ``pytest -m slow`` for their time
(``SLOW_FOR_TIME`` in conftest.py) names tests that exist: a test renamed or removed
would otherwise leave a stale name there, and a renamed test would silently return to
the default suite."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import SLOW_FOR_TIME

ROOT = Path(__file__).resolve().parents[1]


def test_slow_for_time_names_exist():
    missing = []
    for nodeid in sorted(SLOW_FOR_TIME):
        path, name = nodeid.split("::", 1)
        function = name.split("[", 1)[0]
        file = ROOT / path
        if not file.is_file() or not re.search(
            rf"^def {re.escape(function)}\(", file.read_text(encoding="utf-8"), re.MULTILINE
        ):
            missing.append(nodeid)
    assert not missing, f"SLOW_FOR_TIME names tests that do not exist: {missing}"
