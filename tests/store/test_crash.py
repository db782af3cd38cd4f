"""SIGKILL while records are queued (or spooled): they come back on restart, 0 loss."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from guard.store import open_store

from .conftest import count

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


# Killed inside ClickHouse's commit of one table's part. The engine appends the part's block
# id to the table's deduplication log, then renames tmp_insert_<part> to <part>; a SIGKILL
# between the two (strace shows ~0.1 ms) leaves the id without the part, and the replay of
# the batch under its token was taken for a duplicate: the CI flake, 1810 of 2000 runs. The
# test kills the writer right after the 2nd batch's insert into `table`, then rebuilds what a
# kill 0.1 ms earlier leaves on disk: that part back under its tmp_insert_ name (the same
# files), and for runs, no view part of the batch yet (the view's part is written after).
_COMMIT_KILL = r"""
import os, signal, sys
sys.path.insert(0, sys.argv[3])
from conftest import decision, outcome
from guard.store import open_store

data_dir, table, now = sys.argv[1], sys.argv[2], float(sys.argv[4])
s = open_store(None, data_dir=data_dir, batch_rows=10**9, flush_interval_s=3600)
for t in ("runs", "decisions", "stop_reasons_1m"):  # one part per batch, never merged
    s._writer.client.command(f"SYSTEM STOP MERGES otel_guard.{t}")
w = s._writer
real, calls = w.insert, [0]

def insert(kind, token, rows):
    real(kind, token, rows)
    if ("runs" if kind in "rR" else "decisions") == table:
        calls[0] += 1
        if calls[0] == 2:  # committed; the WAL's "done" marker is not written
            os.kill(os.getpid(), signal.SIGKILL)

w.insert = insert
for b in range(2):  # two batches of 200 runs and 10 decisions, one flush each
    for i in range(200 * b, 200 * (b + 1)):
        s.write_run(outcome(i, now=now))
        if i % 20 == 0:
            s.write_decision(decision(i, decided_at=now))
    s.flush(30)
print("not killed", s.counters(), flush=True)
"""


def _uncommit_newest_part(table_dir: Path) -> str:
    parts = [p for p in table_dir.iterdir() if p.is_dir() and p.name[0].isdigit()]
    assert len(parts) == 2, parts  # the batch before and the batch that was killed
    newest = max(parts, key=lambda p: int(p.name.split("_")[1]))
    newest.rename(table_dir / f"tmp_insert_{newest.name}")
    return newest.name


@pytest.mark.parametrize(
    ("table", "uncommitted"),
    [
        ("runs", ("runs", "stop_reasons_1m")),  # killed in runs' window: no view part yet
        ("runs", ("stop_reasons_1m",)),  # runs committed, killed in the view's window
        ("decisions", ("decisions",)),
    ],
    ids=["runs", "view", "decisions"],
)
def test_sigkill_inside_clickhouse_part_commit_loses_nothing(
    tmp_path: Path, table: str, uncommitted: tuple[str, ...]
) -> None:
    noon = (time.time() // 86400) * 86400 + 43200  # one day partition, whenever this runs
    here = str(Path(__file__).parent)
    proc = subprocess.run(
        [sys.executable, "-c", _COMMIT_KILL, str(tmp_path), table, here, str(noon)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr[-2000:]
    engine = tmp_path / "clickhouse"
    assert (engine / "status").exists()  # the engine did not shut down cleanly
    for name in uncommitted:
        _uncommit_newest_part(engine / "data" / "otel_guard" / name)
    with open_store(None, data_dir=tmp_path, flush_interval_s=0.05) as s:
        assert s.flush(30), s.counters()
        assert count(s, "SELECT count() FROM otel_guard.runs") == 400  # once each, unmerged
        assert count(s, "SELECT uniqExact(run_id) FROM otel_guard.runs") == 400
        assert count(s, "SELECT sum(runs) FROM otel_guard.stop_reasons_1m") == 400
        by_group = (
            "SELECT tenant, agent, reason, {n}, {steps} FROM otel_guard.{t} "
            "GROUP BY tenant, agent, reason ORDER BY tenant, agent, reason"
        )
        assert s.query(
            by_group.format(n="sum(runs)", steps="sum(steps_sum)", t="stop_reasons_1m")
        ) == s.query(by_group.format(n="count()", steps="sum(steps)", t="runs"))
        assert count(s, "SELECT count() FROM otel_guard.decisions") == 20
        assert s.counters()["dropped"] == 0
