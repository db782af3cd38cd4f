"""The batching writer: dedup tokens, the MV agreeing with `runs`, outages and overflow."""

from __future__ import annotations

import math
import time
from pathlib import Path

from guard.policy._types import DecidedBy, Outcome, Reason, Status
from guard.store import open_store
from guard.store._rows import decision_row, encode_row, run_row

from .conftest import count, decision, flaky, outcome


def _view_vs_runs(store) -> tuple[list, list]:
    view = store.query(
        "SELECT status, reason, sum(runs), sum(steps_sum), round(sum(cost_usd_sum), 6) "
        "FROM otel_guard.stop_reasons_1m GROUP BY status, reason ORDER BY status, reason"
    )
    runs = store.query(
        "SELECT status, reason, count(), sum(steps), round(sum(ifNull(cost_usd, 0)), 6) "
        "FROM otel_guard.runs FINAL GROUP BY status, reason ORDER BY status, reason"
    )
    return view, runs


def test_view_totals_equal_count_over_runs(store) -> None:
    now = time.time()
    for i in range(3000):
        store.write_run(outcome(i, now=now))
    for i in range(0, 3000, 10):  # the guard hands the same run twice: must count once
        store.write_run(outcome(i, now=now))
    assert store.flush(30)
    # and a retry of an already-committed batch (same token) reaches neither table
    rows = [encode_row(run_row(outcome(i, now=now))) for i in range(3000, 3100)]
    store._writer.insert("r", "test-retry-token", rows)
    store._writer.insert("r", "test-retry-token", rows)
    view, runs = _view_vs_runs(store)
    assert view == runs
    assert (
        sum(r[2] for r in view) == 3100 == count(store, "SELECT count() FROM otel_guard.runs FINAL")
    )
    assert count(store, "SELECT count() FROM otel_guard.runs") == 3100  # no duplicate rows at all
    assert store.counters()["deduplicated"] == 300


def test_retried_batch_is_not_duplicated(store) -> None:
    rows = [encode_row(run_row(outcome(i))) for i in range(500)]
    for _ in range(3):
        store._writer.insert("r", "batch-A", rows)
    drows = [encode_row(decision_row(decision(i))) for i in range(40)]
    store._writer.insert("d", "batch-D", drows)
    store._writer.insert("d", "batch-D", drows)
    assert count(store, "SELECT count() FROM otel_guard.runs") == 500
    assert count(store, "SELECT sum(runs) FROM otel_guard.stop_reasons_1m") == 500
    assert count(store, "SELECT count() FROM otel_guard.decisions") == 40
    store._writer.insert("r", "batch-B", rows[:10])  # a different token is a different batch
    assert count(store, "SELECT count() FROM otel_guard.runs") == 510


def test_clickhouse_unavailable_mid_stream_spools_then_replays(store, tmp_path: Path) -> None:
    client = flaky(store)
    for i in range(300):
        store.write_run(outcome(i))
    assert store.flush(10)
    client.down = True
    for i in range(300, 1100):
        store.write_run(outcome(i))
        if i % 16 == 0:
            store.write_decision(decision(i))
    assert not store.flush(1.0)  # cannot complete while ClickHouse is down
    c = store.counters()
    assert c["spooled"] == 850 and c["written"] == 300 and c["dropped"] == 0
    assert (tmp_path / "guard" / "store" / "spool.log").stat().st_size > 0
    assert client.failures >= 1
    client.down = False
    assert store.flush(20)
    c = store.counters()
    assert c["replayed"] == c["spooled"] == 850 and c["written"] == 1150 and c["dropped"] == 0
    assert count(store, "SELECT count() FROM otel_guard.runs") == 1100
    assert count(store, "SELECT count() FROM otel_guard.decisions") == 50
    assert count(store, "SELECT uniqExact(run_id) FROM otel_guard.runs") == 1100
    view, runs = _view_vs_runs(store)
    assert view == runs
    assert (tmp_path / "guard" / "store" / "spool.log").stat().st_size == 0  # drained


def test_spool_survives_a_restart_and_replays_in_order(tmp_path: Path) -> None:
    s = open_store(None, data_dir=tmp_path, flush_interval_s=0.05)
    flaky(s).down = True
    for i in range(400):
        s.write_run(outcome(i))
    s.close(timeout_s=0.5)  # ClickHouse still down: records stay on disk
    assert s.counters()["written"] == 0
    with open_store(None, data_dir=tmp_path, flush_interval_s=0.05) as s2:
        assert s2.flush(20)
        assert count(s2, "SELECT count() FROM otel_guard.runs") == 400
        assert s2.counters()["replayed"] == 400


def test_queue_overflow_is_read_back_from_the_wal(tmp_path: Path) -> None:
    # A tiny queue and a writer that would wait an hour: records overflow memory, not disk.
    with open_store(
        None, data_dir=tmp_path, max_queue=10, batch_rows=10**9, flush_interval_s=3600
    ) as s:
        for i in range(250):
            s.write_run(outcome(i))
        assert s.counters()["pending"] == 10
        assert s.flush(20)
        assert count(s, "SELECT count() FROM otel_guard.runs") == 250
        assert s.counters()["dropped"] == 0


def test_records_round_trip_and_bad_values_never_raise(store) -> None:
    T0 = int(time.time()) - 60
    full = Outcome(
        run_id="r-full", status=Status.TERMINATED, reason=Reason.COST_BUDGET, message="cost 0.51 > 0.50",
        parent_run_id="r-parent", tenant="acme", agent="refund-bot", trace_id="ab" * 16, steps=7,
        model_calls=8, tool_calls=9, tool_attempts=11, input_tokens=1200, output_tokens=90,
        reasoning_tokens=40, cached_tokens=300, cost_usd=0.51, elapsed_ms=4321, deadline_ms=90_000,
        last_tool="search", last_action_hash="f" * 32, loop_hits=2, partial_result=True,
        recoverable=True, decided_by=DecidedBy.GUARD, price_book_version="2026-11",
        started_at=T0 + 0.25, ended_at=T0 + 4.5,
    )  # fmt: skip
    store.write_run(full)
    bad = Outcome(
        run_id="r-bad", status=Status.FAILED, reason=Reason.ERROR, steps=-5, cost_usd=math.nan
    )
    store.write_run(bad)
    store.write_run(None)  # type: ignore[arg-type]  # logged, never raised
    store.write_decision(decision(1, utilisation=math.inf, metric=None))
    assert store.flush(10)
    cols = "run_id, parent_run_id, steps, cost_usd, deadline_ms, last_tool, partial_result, decided_by, toUnixTimestamp64Milli(started_at)"
    got = {r[0]: r for r in store.query(f"SELECT {cols} FROM otel_guard.runs")}
    assert got["r-full"] == (
        "r-full",
        "r-parent",
        7,
        0.51,
        90_000,
        "search",
        True,
        "guard",
        T0 * 1000 + 250,
    )
    assert got["r-bad"][1:6] == (None, 0, None, None, None)
    (ended,) = store.query(
        "SELECT toUnixTimestamp(ended_at) FROM otel_guard.runs WHERE run_id = 'r-bad'"
    )[0]
    assert ended >= T0  # an unset ended_at is the write time, not 1970 (which TTL would drop)
    (d,) = store.query(
        "SELECT action, utilisation, metric, delivery_latency_ms FROM otel_guard.decisions"
    )
    assert d == ("wrap_up", None, None, 3.5)


def test_batch_committed_but_not_marked_done_is_not_duplicated_on_restart(tmp_path: Path) -> None:
    # The crash window between "ClickHouse has the batch" and "the WAL says so": on restart
    # the batch is replayed with its original token and deduplicated.
    s = open_store(None, data_dir=tmp_path, flush_interval_s=0.05)
    s._wal.mark_done = lambda hi: None  # the "done" marker never reaches the WAL
    close_wal = s._wal.close
    s._wal.close = lambda delete: close_wal(delete=False)  # and the WAL survives, as after a crash
    for i in range(300):
        s.write_run(outcome(i))
    assert s.flush(10)
    assert count(s, "SELECT count() FROM otel_guard.runs") == 300
    s.close()
    with open_store(None, data_dir=tmp_path, flush_interval_s=0.05) as s2:
        assert s2.counters()["spooled"] == 300  # recovered from the WAL ...
        assert s2.flush(10)
        assert s2.counters()["replayed"] == 300  # ... replayed ...
        assert count(s2, "SELECT count() FROM otel_guard.runs") == 300  # ... and deduplicated
        assert count(s2, "SELECT sum(runs) FROM otel_guard.stop_reasons_1m") == 300


def test_a_spooled_batch_clickhouse_rejects_is_dead_lettered_and_the_rest_flows(store) -> None:
    bad = '["r-bad","x","acme","a","failed","error","",' + '"not-a-time"' + ",0]"
    store._spool.append("d", "poison-1", [bad])
    store._writer.wake.set()
    for i in range(50):
        store.write_run(outcome(i))
    assert store.flush(20)
    c = store.counters()
    assert c["dead_lettered"] == 1 and c["written"] == 50 and c["dropped"] == 0
    assert count(store, "SELECT count() FROM otel_guard.runs") == 50
    assert store.query("SELECT table, token, row FROM otel_guard.dead_letter") == [
        ("decisions", "poison-1", bad)
    ]


def test_wal_segments_rotate_and_committed_ones_are_deleted(tmp_path: Path) -> None:
    with open_store(None, data_dir=tmp_path, batch_rows=200, flush_interval_s=0.02) as s:
        s._wal.segment_bytes = 16 * 1024
        for i in range(3000):
            s.write_run(outcome(i))
        assert s.flush(20)
        wal = tmp_path / "store" / "wal"
        # ~1 MB of records went through; only the live segment (+ one not yet retired) stays
        assert len(list(wal.glob("seg-*.log"))) <= 2
        assert count(s, "SELECT count() FROM otel_guard.runs") == 3000
    assert not list((tmp_path / "store" / "wal").glob("seg-*.log"))  # clean close: no WAL left
