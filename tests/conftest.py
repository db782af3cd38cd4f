"""Shared by every test directory.

``tests/`` is on ``sys.path`` (pytest's rootdir-relative ``prepend`` import mode puts it there
for this conftest; the line below keeps it so under any import mode), so shared helpers import
by module name: ``from _wait import wait_until, wait_until_async``, the one way a test waits
for an event (see ``tests/_wait.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
