"""SIGKILL while records are queued (or spooled): they come back on restart, 0 loss."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import count

from guard.store import open_store

# The "guard": accepts records, acknowledges them (prints "ready"), and is then killed.
# mode "queued": the writer would wait an hour before its first batch, so every record is
# in memory only (and in the WAL). mode "spooled": ClickHouse is down, records reach the
# spool; then more are queued behind. mode "inflight": batches are being inserted.
_GUARD = r"""
import sys, time
sys.path.insert(0, sys.argv[3])
from conftest import decision, flaky, outcome
from guard.store import open_store

data_dir, mode = sys.argv[1], sys.argv[2]
if mode == "queued":
    s = open_store(None, data_dir=data_dir, batch_rows=10**9, flush_interval_s=3600)
else:
    s = open_store(None, data_dir=data_dir, batch_rows=200, flush_interval_s=0.01)
s._wal.segment_bytes = 64 * 1024  # recovery must stitch many WAL segments together
if mode == "spooled":
    flaky(s).down = True
for i in range(2000):
    s.write_run(outcome(i))
    if i % 20 == 0:
        s.write_decision(decision(i))
    if mode == "spooled" and i == 1500:
        s.flush(0.5)  # let the first 1500 reach the spool; the rest stays queued
print("ready", s.counters(), flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("mode", ["queued", "spooled", "inflight"])
def test_sigkill_while_records_are_queued_loses_nothing(tmp_path: Path, mode: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _GUARD, str(tmp_path), mode, str(Path(__file__).parent)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("ready"), line
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
    with open_store(None, data_dir=tmp_path, flush_interval_s=0.05) as s:
        assert s.flush(30), s.counters()
        assert count(s, "SELECT count() FROM otel_guard.runs FINAL") == 2000
        assert count(s, "SELECT uniqExact(run_id) FROM otel_guard.runs") == 2000
        assert count(s, "SELECT count() FROM otel_guard.decisions") == 100
        assert s.report().total_runs == 2000  # the distribution agrees
        assert s.counters()["dropped"] == 0
