"""The store on a full disk: a run record is durable (WAL) or refused, never acknowledged and
then lost. Failures are injected at the file writes (ENOSPC), with the real embedded engine.
The end-to-end version, a real guard on a small filesystem, is
``tests/server/test_full_disk_fleet.py``."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest
from _wait import wait_until

from guard.store import RecordNotDurable, open_store
from guard.store._wal import Spool, Wal

from .conftest import count, decision, flaky, outcome


class _Switch:
    """``on``: the wrapped file write fails with ENOSPC, like a full disk."""

    def __init__(self) -> None:
        self.on = False
        self.failures = 0

    def wrap(self, fn):
        def call(*a, **kw):
            if self.on:
                self.failures += 1
                raise OSError(errno.ENOSPC, "No space left on device (injected)")
            return fn(*a, **kw)

        return call


def _view_and_runs(store) -> tuple[int, int, int]:
    runs = count(store, "SELECT count() FROM otel_guard.runs")
    ids = count(store, "SELECT uniqExact(run_id) FROM otel_guard.runs")
    view = count(store, "SELECT sum(runs) FROM otel_guard.stop_reasons_1m")
    return runs, ids, view


def test_wal_append_failing_refuses_the_record_and_holds_nothing(tmp_path: Path, caplog) -> None:
    s = open_store(None, data_dir=tmp_path, flush_interval_s=0.05)
    try:
        wal = _Switch()
        s._wal.append_record = wal.wrap(s._wal.append_record)
        s.write_run(outcome(0))
        wal.on = True
        with caplog.at_level(logging.INFO, logger="guard.store"):
            for i in range(1, 21):
                with pytest.raises(RecordNotDurable):
                    s.write_run(outcome(i))
            s.write_decision(decision(1))  # not acknowledged by anyone: never raises
            c = s.counters()
            assert c["disk_full"] == 1 and c["refused"] == 20 and s.disk_full
            assert c["queued"] == 2  # record 0 and the decision; the refused ones are not in
            wal.on = False
            s.write_run(outcome(1))  # the agent's resend of a refused record: taken now
            assert not s.disk_full
        assert s.flush(20)
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        infos = [r for r in caplog.records if "writable again" in r.getMessage()]
        assert len(warnings) == 1 and "disk full" in warnings[0].getMessage()  # not per record
        assert len(infos) == 1
        assert count(s, "SELECT count() FROM otel_guard.runs") == 2
        assert s.counters()["dropped"] == 0
    finally:
        s.close()


def test_insert_and_spool_failing_keeps_the_records_and_writes_them_once(tmp_path: Path) -> None:
    s = open_store(None, data_dir=tmp_path, flush_interval_s=0.05)
    try:
        for i in range(100):
            s.write_run(outcome(i))
        assert s.flush(20)
        client = flaky(s)
        spool = _Switch()
        s._spool.append = spool.wrap(s._spool.append)
        client.down = spool.on = True  # ClickHouse refuses (NOT_ENOUGH_SPACE) and so does the spool
        for i in range(100, 700):
            s.write_run(outcome(i))  # the WAL still takes them: durable, acknowledged
            if i % 50 == 0:
                s.write_decision(decision(i))
        wait_until(lambda: s.counters()["held"] == 612, 20, "every new record held")
        c = s.counters()
        assert c["dropped"] == 0 and c["disk_full"] == 1 and s.disk_full
        assert spool.failures >= 1
        s.write_run(outcome(700))  # under the bound: still taken (behind the held ones)
        s.write_run(outcome(100))  # a repeat of a held record: first one wins
        assert not s.flush(0.5)
        # the disk has room again: the held batches reach the spool, then ClickHouse
        spool.on = client.down = False
        assert s.flush(30), s.counters()
        c = s.counters()
        assert c["held"] == 0 and c["disk_full"] == 0 and c["dropped"] == 0
        assert _view_and_runs(s) == (701, 701, 701)
        assert count(s, "SELECT count() FROM otel_guard.decisions") == 12
    finally:
        s.close()


def test_at_the_memory_bound_new_records_are_refused_not_old_ones_dropped(tmp_path: Path) -> None:
    s = open_store(None, data_dir=tmp_path, flush_interval_s=0.05, max_held=50)
    try:
        client = flaky(s)
        spool = _Switch()
        s._spool.append = spool.wrap(s._spool.append)
        client.down = spool.on = True
        for i in range(60):
            s.write_run(outcome(i))
        wait_until(lambda: s.counters()["held"] == 60, 20, "held")
        with pytest.raises(RecordNotDurable, match="held in memory"):
            s.write_run(outcome(60))
        assert s.counters()["refused"] == 1
        spool.on = client.down = False
        assert s.flush(30), s.counters()
        s.write_run(outcome(60))  # the resend, once the held records are out
        assert s.flush(20)
        assert _view_and_runs(s) == (61, 61, 61)
        assert s.counters()["dropped"] == 0
    finally:
        s.close()


def test_records_held_at_close_are_recovered_once_at_the_next_open(tmp_path: Path) -> None:
    s = open_store(None, data_dir=tmp_path, flush_interval_s=0.05)
    client = flaky(s)
    spool = _Switch()
    s._spool.append = spool.wrap(s._spool.append)
    for i in range(40):
        s.write_run(outcome(i))
    assert s.flush(20)
    client.down = spool.on = True
    for i in range(40, 240):
        s.write_run(outcome(i))
    wait_until(lambda: s.counters()["held"] == 200, 20, "held")
    s.close(timeout_s=2.0)  # still full: the held records stay in the WAL
    assert list((tmp_path / "store" / "wal").glob("seg-*.log"))
    with open_store(None, data_dir=tmp_path, flush_interval_s=0.05) as s2:
        assert s2.flush(30), s2.counters()
        assert _view_and_runs(s2) == (240, 240, 240)


def test_a_short_wal_write_leaves_no_torn_line_behind(tmp_path: Path, monkeypatch) -> None:
    wal = Wal(tmp_path / "wal", epoch="e1")
    wal.append_record(1, "r", '["a",1]')
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, data[: len(data) // 2]))
    with pytest.raises(OSError):
        wal.append_record(2, "r", '["b",2]')  # the disk took half the line
    monkeypatch.setattr(os, "write", real)
    wal.append_record(3, "r", '["c",3]')  # acknowledged: must survive a crash intact
    wal.close(delete=False)
    pending, loose, _ = Wal(tmp_path / "wal", epoch="e2").recover()
    assert pending == []
    assert loose == [(1, "r", '["a",1]'), (3, "r", '["c",3]')]


def test_a_spool_short_write_is_cut_and_the_spool_stays_readable(tmp_path: Path, monkeypatch):
    sp = Spool(tmp_path)
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, data[:5]))
    with pytest.raises(OSError):
        sp.append("d", "t1", ['["x"]'])
    monkeypatch.setattr(os, "write", real)
    sp.append("d", "t2", ['["y"]'])
    assert [item[2] for item in sp.peek()] == ["t2"]
    sp.close()
