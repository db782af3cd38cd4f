"""A bounded run of ``benchmarks/soak_replica_kill.py`` (one SIGKILL trial, one Redis trial):
the script keeps working, and its verdict holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "soak_replica_kill.py"


def test_soak_replica_kill_bounded_run() -> None:
    args = ["--trials", "2", "--redis-every", "2", "--agents", "2", "--bounded", "2"]
    out = subprocess.run(
        [sys.executable, str(_SCRIPT), *args, "--slow-s", "1", "--redis-down-s", "1"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.splitlines()[-1])
    assert summary["kill_trials"] == 1 and summary["redis_trials"] == 1, summary
    assert summary["runs"] == 2 * 2 * 3, summary
    assert summary["ok"], summary
