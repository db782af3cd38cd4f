"""Exactly once in the store: SIGKILL the writer at each point, restart, re-send the same runs.

After every crash and every repeat (WAL recovery, spool replay, an SDK resend, a repeat that
names another tenant/agent): one ``runs`` row per run id, and ``stop_reasons_1m`` counts each
run once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from guard.store import open_store

from .conftest import count, flaky, outcome

N = 600

# The "guard": writes runs lo..hi (batches of 200) and dies by SIGKILL at one point of the writer.
#   queued        everything accepted, no batch formed yet (killed from outside)
#   after_mark    the 2nd runs batch is marked in the WAL, killed before its insert
#   after_insert  the 2nd runs batch is in ClickHouse, killed before its "done" marker
#   spooled       ClickHouse down: everything in the spool (killed from outside)
#   mid_replay    ClickHouse back: killed right after the 1st spooled batch's replay insert
_GUARD = r"""
import os, signal, sys
sys.path.insert(0, sys.argv[3])
from conftest import flaky, outcome
from guard.store import open_store

data_dir, mode, lo, hi = sys.argv[1], sys.argv[2], int(sys.argv[4]), int(sys.argv[5])
if mode == "queued":
    s = open_store(None, data_dir=data_dir, batch_rows=10**9, flush_interval_s=3600)
else:
    s = open_store(None, data_dir=data_dir, batch_rows=200, flush_interval_s=0.01)
w = s._writer
real, calls = w.insert, [0]

def insert(kind, token, rows):
    if kind in "rR":
        calls[0] += 1
        if mode == "after_mark" and calls[0] == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        real(kind, token, rows)
        if mode in ("after_insert", "mid_replay") and calls[0] == 2:
            os.kill(os.getpid(), signal.SIGKILL)
    else:
        real(kind, token, rows)

if mode in ("spooled", "mid_replay"):
    client = flaky(s)
    client.down = True
    calls[0] = 1  # mid_replay: the first insert after ClickHouse is back is the 2nd call
w.insert = insert
for i in range(lo, hi):
    s.write_run(outcome(i))
if mode in ("spooled", "mid_replay"):
    s.flush(1.0)
    if mode == "mid_replay":
        client.down = False
        s.flush(30)
print("ready", s.counters(), flush=True)
if mode in ("queued", "spooled"):
    sys.stdin.readline()  # killed from outside
s.flush(30)
print("not killed", s.counters(), flush=True)
"""


def _crash(data_dir: Path, mode: str, lo: int, hi: int) -> None:
    here = str(Path(__file__).parent)
    proc = subprocess.Popen(
        [sys.executable, "-c", _GUARD, str(data_dir), mode, here, str(lo), str(hi)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        if mode in ("queued", "spooled"):
            line = proc.stdout.readline()
            assert line.startswith("ready"), line
            os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(60) == -signal.SIGKILL, proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        proc.stdin.close()


def _assert_exactly_once(s, n: int) -> None:
    assert count(s, "SELECT count() FROM otel_guard.runs") == n  # no second row, not even unmerged
    assert count(s, "SELECT uniqExact(run_id) FROM otel_guard.runs") == n
    assert count(s, "SELECT sum(runs) FROM otel_guard.stop_reasons_1m") == n
    view = s.query(
        "SELECT tenant, agent, reason, sum(runs), sum(steps_sum) FROM otel_guard.stop_reasons_1m "
        "GROUP BY tenant, agent, reason ORDER BY tenant, agent, reason"
    )
    runs = s.query(
        "SELECT tenant, agent, reason, count(), sum(steps) FROM otel_guard.runs "
        "GROUP BY tenant, agent, reason ORDER BY tenant, agent, reason"
    )
    assert view == runs
    # first record wins: the re-sends under another tenant/agent added nothing
    assert count(s, "SELECT count() FROM otel_guard.runs WHERE tenant = 'intruder'") == 0


def _resend(s, n: int) -> None:
    """What a restarted guard receives: the SDK's resends and span-derived records for the
    same runs, half of them naming another tenant and agent."""
    for i in range(n):
        kw = {"tenant": "intruder", "agent": "stray"} if i % 2 else {}
        s.write_run(outcome(i, **kw))


@pytest.mark.parametrize("mode", ["queued", "after_mark", "after_insert", "spooled", "mid_replay"])
def test_sigkill_then_resend_counts_every_run_once(tmp_path: Path, mode: str) -> None:
    _crash(tmp_path, mode, 0, N)
    with open_store(None, data_dir=tmp_path, flush_interval_s=0.05) as s:
        _resend(s, N)  # while the recovered copies may still be in the spool
        assert s.flush(60), s.counters()
        _assert_exactly_once(s, N)
        assert s.counters()["dropped"] == 0
    # a second kill in the same fleet, half of its runs repeats of committed ones; this time
    # ClickHouse is down while the resends arrive, so they queue behind the recovered copies
    _crash(tmp_path, mode, N // 2, N + N // 2)
    with open_store(None, data_dir=tmp_path, flush_interval_s=3600) as s:
        client = flaky(s)  # the writer sleeps until flushed: nothing was replayed yet
        client.down = True
        _resend(s, N + N // 2)
        assert not s.flush(0.5)
        client.down = False
        assert s.flush(60), s.counters()
        _assert_exactly_once(s, N + N // 2)


def test_a_repeat_naming_another_tenant_and_agent_adds_no_row(tmp_path: Path) -> None:
    now = time.time()
    with open_store(None, data_dir=tmp_path, flush_interval_s=0.05) as s:
        s.write_run(outcome(1, now=now))
        assert s.flush(10)
    with open_store(None, data_dir=tmp_path, flush_interval_s=0.05) as s:  # a new process
        s.write_run(outcome(1, now=now + 50, tenant="intruder", agent="stray", steps=3))
        s.write_run(outcome(2, now=now))
        assert s.flush(10)
        assert s.query("SELECT run_id, tenant FROM otel_guard.runs ORDER BY run_id") == [
            ("run-000001", "globex"),
            ("run-000002", "acme"),
        ]
        assert count(s, "SELECT sum(runs) FROM otel_guard.stop_reasons_1m") == 2
        assert s.counters()["deduplicated"] == 1
