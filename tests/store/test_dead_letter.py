"""A record ClickHouse refuses as bad data is quarantined and never blocks the ones behind it."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

from guard.store import open_store
from guard.store._dedup import RunIdFilter
from guard.store._rows import encode_row, run_row

from .conftest import count, flaky, outcome


def _overflow_row(i: int) -> tuple[str, str]:
    """A runs row whose started_at ClickHouse refuses (Code: 407 DECIMAL_OVERFLOW), as one
    RunEnded with started_at_unix=1e18 produced before the wire was bounded."""
    row = run_row(outcome(i))
    row[7] = 1e18
    return encode_row(row), row[0]


def _store_errors(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "guard.store" and r.levelno >= logging.ERROR]


def test_one_decimal_overflow_row_is_quarantined_and_the_batch_delivered(
    tmp_path: Path, caplog
) -> None:
    caplog.set_level(logging.WARNING, logger="guard.store")
    # one batch of 100 (the writer only cuts it at flush), row 37 bad
    with open_store(None, data_dir=tmp_path, batch_rows=10**6, flush_interval_s=3600) as s:
        for i in range(100):
            if i == 37:
                bad, bad_id = _overflow_row(i)
                s._accept("r", bad, bad_id)
            else:
                s.write_run(outcome(i))
        assert s.flush(30), s.counters()
        assert count(s, "SELECT count() FROM otel_guard.runs") == 99
        assert count(s, f"SELECT count() FROM otel_guard.runs WHERE run_id = '{bad_id}'") == 0
        assert count(s, "SELECT sum(runs) FROM otel_guard.stop_reasons_1m") == 99
        (dl,) = s.query("SELECT table, error, row FROM otel_guard.dead_letter")
        assert dl[0] == "runs" and "DECIMAL_OVERFLOW" in dl[1] and dl[2] == bad
        c = s.counters()
        assert c["dead_lettered"] == 1 and c["written"] == 99 and c["dropped"] == 0
        (line,) = _store_errors(caplog)  # one line for the event, not a traceback
        assert line.exc_info is None and "\n" not in line.getMessage()
        assert "1 of 100 runs rows" in line.getMessage()
        for i in range(100, 110):  # and later records still land
            s.write_run(outcome(i))
        assert s.flush(30)
        assert count(s, "SELECT count() FROM otel_guard.runs") == 109


def test_a_poison_batch_in_the_spool_does_not_block_a_restart(tmp_path: Path) -> None:
    s = open_store(None, data_dir=tmp_path, flush_interval_s=0.05)
    flaky(s).down = True
    for i in range(50):
        s.write_run(outcome(i))
    s._accept("r", *_overflow_row(50))
    for i in range(51, 60):
        s.write_run(outcome(i))
    assert not s.flush(0.5)
    s.close(timeout_s=0.5)  # ClickHouse still down: the poison batch stays in the spool
    assert (tmp_path / "store" / "spool.log").stat().st_size > 0
    with open_store(None, data_dir=tmp_path, flush_interval_s=0.05) as s2:
        assert s2.flush(30), s2.counters()
        assert count(s2, "SELECT count() FROM otel_guard.runs") == 59
        assert s2.counters()["dead_lettered"] == 1
        s2.write_run(outcome(60))
        assert s2.flush(30)
        assert count(s2, "SELECT count() FROM otel_guard.runs") == 60
    with open_store(None, data_dir=tmp_path, flush_interval_s=0.05) as s3:  # nothing left over
        assert s3.flush(10)
        assert s3.counters()["dead_lettered"] == 0
        assert count(s3, "SELECT count() FROM otel_guard.dead_letter") == 1
        assert count(s3, "SELECT sum(runs) FROM otel_guard.stop_reasons_1m") == 60


def test_a_record_that_cannot_become_a_row_is_dead_lettered_not_dropped(store, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="guard.store")
    store.write_run(outcome(1, started_at=1e18))  # not true data: not clamped, quarantined
    store.write_run(None)  # type: ignore[arg-type]  # never raises, never vanishes
    store.write_run(outcome(2))
    assert store.flush(10)
    assert store.query("SELECT run_id FROM otel_guard.runs") == [("run-000002",)]
    rows = store.query("SELECT table, error, row FROM otel_guard.dead_letter ORDER BY row")
    assert [r[0] for r in rows] == ["runs", "runs"]
    assert any("past year 2299" in r[1] and "run-000001" in r[2] for r in rows)
    assert any(r[2] == "None" for r in rows)
    assert store.counters()["dead_lettered"] == 2
    errors = _store_errors(caplog)
    assert len(errors) == 2 and all(r.exc_info is None for r in errors)


def test_the_run_id_filter_has_no_false_negatives_and_few_false_positives() -> None:
    f = RunIdFilter(capacity=50_000)  # too small on purpose: it must grow, not saturate
    added = [uuid.uuid4().hex for _ in range(200_000)]
    for i in range(0, len(added), 10_000):
        f.add(added[i : i + 10_000])
    assert f.maybe(added) == added
    others = [uuid.uuid4().hex for _ in range(100_000)]
    assert len(f.maybe(others)) < 1_000  # < 1 % (measured ~0.1 %)
