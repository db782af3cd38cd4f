"""The guard process's collector settings (``guard.server.runtime._gc``), in a child process: they are
process-wide."""

from __future__ import annotations

import subprocess
import sys


def test_bound_gc_pauses_freezes_and_raises_the_young_threshold():
    code = (
        "import gc\n"
        "from guard.server.runtime._gc import YOUNG_THRESHOLD, bound_gc_pauses\n"
        "before = gc.get_threshold()\n"
        "bound_gc_pauses()\n"
        "after = gc.get_threshold()\n"
        "assert after == (YOUNG_THRESHOLD, before[1], before[2]), (before, after)\n"
        "assert gc.get_freeze_count() > 0\n"
        "frozen = gc.get_freeze_count()\n"
        "keep = [[i] for i in range(1000)]\n"
        "gc.collect()\n"  # a full collection: its survivors are frozen too
        "assert gc.get_freeze_count() >= frozen + 1000, gc.get_freeze_count()\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
