"""Store benchmark: run records/s into the embedded ClickHouse, and report/dashboard query p95.

Prints one JSON object. Goals: ``Store.write_run`` until committed >= 0.8x a bare
clickhouse-connect native insert of the same rows (and >= 50k records/s). ``ingest`` runs, in
one engine and interleaved over ``--trials`` rounds (the order rotates, so background merges of
earlier rounds fall on every variant alike; median of the rounds):
- ``store``: ``write_run`` of ``Outcome``s (row building, WAL append, batching, WAL fsync per
  batch, the exactly-once check, token-deduplicated inserts), timed until ``flush`` returns,
  i.e. every row is committed and queryable;
- ``store_python_line``: the same with the WAL line formatted by the Python fast path
  (``_rows._py_line``) instead of the native one (``_rowsnative``): the native's baseline;
- ``store_no_check``: the same with the exactly-once check (in-memory recent ids, the
  committed-run-id filter and its ClickHouse lookups) swapped out, to show the check's cost;
- ``floor``: the same ``Outcome``s inserted 10k per call with ``client.insert`` (Native
  format, no token) into an identically migrated database, the row being the fields as they
  are (no sanitising, timestamps as DateTime64 ticks): what a bare clickhouse-connect writer
  pays from the same input until committed, with none of the store's guarantees;
- ``floor_prebuilt``: the same inserts of rows built before the clock starts (the strictest
  floor: it skips even reading the ``Outcome``s).
Each reports wall time and the process's CPU time (all threads, the engine's included): the
CPU figure is the steadier one on a shared machine. ``--gc guard`` (the default) runs them
with the collector tuned as in ``otel-guard serve``, the process the store lives in.

``run_line``: the WAL line of a ``runs`` row alone, native (``_rowsnative``) against the
Python fast path and against msgspec (``_msgspec_line``: the library that could stand in for
the C), CPU per record. ``dedup``: the cost of the exactly-once check per 10k-record
batch with 1M runs already stored (the committed-run-id filter plus the ClickHouse lookup of
what it cannot rule out, next to asking ClickHouse about every id). ``queries``: the p95 of
the report and dashboard-style queries over 1M seeded runs.

    python benchmarks/bench_store.py [--runs 200000] [--trials 5] [--seed-runs 1000000]
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import random
import resource
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from guard.policy._types import REASON_STATUS, DecidedBy, Outcome, Reason
from guard.server.runtime._gc import bound_gc_pauses
from guard.store import _rows, open_store
from guard.store._dedup import CommittedRuns
from guard.store._schema import RUN_COLUMNS, migrate

REASONS = list(Reason)


def outcomes(n: int, now: float, prefix: str = "bench") -> list[Outcome]:
    rng = random.Random(7)
    out = []
    for i in range(n):
        reason = REASONS[rng.randrange(len(REASONS))]
        ended = now - rng.random() * 86400
        out.append(
            Outcome(
                run_id=f"{prefix}-{i:08d}",
                status=REASON_STATUS[reason],
                reason=reason,
                message="max_steps 12 reached (steps=12)",
                tenant=f"tenant-{i % 20}",
                agent=f"agent-{i % 7}",
                trace_id=f"{i:032x}",
                steps=rng.randint(1, 60),
                model_calls=rng.randint(1, 60),
                tool_calls=rng.randint(0, 90),
                input_tokens=rng.randint(100, 200_000),
                output_tokens=rng.randint(10, 9000),
                cost_usd=rng.random(),
                elapsed_ms=rng.randint(50, 120_000),
                deadline_ms=120_000,
                last_tool="search",
                last_action_hash="ab" * 16,
                decided_by=DecidedBy.SDK,
                price_book_version="2026-11",
                started_at=ended - 30,
                ended_at=ended,
            )
        )
    return out


def p95(samples: list[float]) -> float:
    return (
        statistics.quantiles(samples, n=20, method="inclusive")[18]
        if len(samples) > 1
        else samples[0]
    )


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


_VARIANTS = ["store", "store_python_line", "store_no_check", "floor", "floor_prebuilt"]


class _NoCheck:
    """Stands in for the writer's exactly-once check (``store_no_check`` only)."""

    loaded = True

    def present(self, client, ids) -> set:
        return set()

    def isdisjoint(self, ids) -> bool:
        return True

    def add(self, ids) -> None:
        pass


def _time_store(store, recs: list[Outcome], check: bool) -> tuple[float, ...]:
    w = store._writer
    saved = w.committed, w._recent
    if not check:
        w.committed = w._recent = _NoCheck()
    try:
        before = store.counters()["written"]
        writer_clock = time.pthread_getcpuclockid(w.ident)
        t0, c0, w0 = time.perf_counter(), _cpu_s(), time.clock_gettime(writer_clock)
        t_caller = time.thread_time()
        for o in recs:
            store.write_run(o)
        accepted_s = time.perf_counter() - t0
        caller_s = time.thread_time() - t_caller
        assert store.flush(600), store.counters()
        wall, cpu = time.perf_counter() - t0, _cpu_s() - c0
        writer_s = time.clock_gettime(writer_clock) - w0
    finally:
        w.committed, w._recent = saved
    c = store.counters()
    assert c["written"] - before == len(recs) and c["dropped"] == c["deduplicated"] == 0, c
    return wall, cpu, accepted_s, caller_s, writer_s


_FIELDS = operator.attrgetter(*RUN_COLUMNS)


def _bare_rows(recs: list[Outcome]) -> list[list]:
    """What a bare writer does with an Outcome: its fields in column order, ticks for times."""
    rows = []
    for o in recs:
        r = list(_FIELDS(o))
        r[7], r[8] = round(r[7] * 1000), round(r[8] * 1000)
        rows.append(r)
    return rows


def _time_floor(client, recs: list[Outcome], prebuilt: bool) -> tuple[float, float]:
    rows = _bare_rows(recs) if prebuilt else []
    t0, c0 = time.perf_counter(), _cpu_s()
    if not prebuilt:
        rows = _bare_rows(recs)
    for i in range(0, len(rows), 10_000):
        client.insert("otel_guard_floor.runs", rows[i : i + 10_000], column_names=list(RUN_COLUMNS))
    return time.perf_counter() - t0, _cpu_s() - c0


def bench_ingest(data_dir: Path, n: int, batch_rows: int, trials: int) -> dict:
    now = time.time()
    samples: dict[str, dict[str, list[float]]] = {k: {"wall_s": [], "cpu_s": []} for k in _VARIANTS}
    accept_us: list[float] = []
    # where the store's CPU goes: write_run's thread (row, WAL line, queue), the writer thread
    # (batching, the check, markers, fsync, and the engine's work it runs), the engine's pool
    split: dict[str, list[float]] = {"caller_thread": [], "writer_thread": [], "other_threads": []}
    with open_store(None, data_dir=data_dir / "ingest", batch_rows=batch_rows) as store:
        client = store._writer.client
        migrate(client, "otel_guard_floor", retention_days=90)
        for t in range(trials):
            k = t % len(_VARIANTS)
            for variant in _VARIANTS[k:] + _VARIANTS[:k]:
                recs = outcomes(n, now, prefix=f"{variant}-{t}")
                if variant.startswith("floor"):
                    wall, cpu = _time_floor(client, recs, prebuilt=variant == "floor_prebuilt")
                else:  # store_python_line: the WAL line by _rows._py_line (the native's baseline)
                    native = _rows.use_native(variant != "store_python_line")
                    try:
                        wall, cpu, acc, caller, writer = _time_store(
                            store, recs, variant != "store_no_check"
                        )
                    finally:
                        _rows.use_native(native)
                    if variant == "store":
                        accept_us.append(acc / n * 1e6)
                        split["caller_thread"].append(caller)
                        split["writer_thread"].append(writer)
                        split["other_threads"].append(cpu - caller - writer)
                samples[variant]["wall_s"].append(wall)
                samples[variant]["cpu_s"].append(cpu)
        stored = int(store.query("SELECT count() FROM otel_guard.runs")[0][0])
        distinct = int(store.query("SELECT uniqExact(run_id) FROM otel_guard.runs")[0][0])
        assert stored == distinct == 3 * n * trials, (stored, distinct)
        floor = int(store.query("SELECT uniqExact(run_id) FROM otel_guard_floor.runs")[0][0])
        assert floor == 2 * n * trials, floor

    def med(variant: str, key: str) -> float:
        return statistics.median(samples[variant][key])

    def ratios(a: str, b: str, key: str) -> list[float]:  # per trial: b's time / a's time
        return [round(y / x, 3) for x, y in zip(samples[a][key], samples[b][key], strict=True)]

    store_wall, floor_wall = med("store", "wall_s"), med("floor", "wall_s")
    check_wall = ratios("store_no_check", "store", "wall_s")
    check_cpu = ratios("store_no_check", "store", "cpu_s")
    return {
        "records_per_trial": n,
        "trials": trials,
        "batch_rows": batch_rows,
        "write_run_us_median": round(statistics.median(accept_us), 2),
        "records_per_s": {k: round(n / med(k, "wall_s")) for k in samples},
        "cpu_us_per_record": {k: round(med(k, "cpu_s") / n * 1e6, 1) for k in samples},
        "store_cpu_us_per_record_by_thread": {
            k: round(statistics.median(v) / n * 1e6, 1) for k, v in split.items()
        },
        "wall_s": {k: [round(x, 2) for x in v["wall_s"]] for k, v in samples.items()},
        "cpu_s": {k: [round(x, 2) for x in v["cpu_s"]] for k, v in samples.items()},
        # the goal: floor time / store time (>= 0.8), median over the trials
        "ratio_vs_native_floor": round(statistics.median(ratios("store", "floor", "wall_s")), 3),
        "ratio_vs_native_floor_per_trial": ratios("store", "floor", "wall_s"),
        "cpu_ratio_vs_native_floor": round(statistics.median(ratios("store", "floor", "cpu_s")), 3),
        "ratio_vs_prebuilt_floor": round(
            statistics.median(ratios("store", "floor_prebuilt", "wall_s")), 3
        ),
        "cpu_ratio_vs_prebuilt_floor": round(
            statistics.median(ratios("store", "floor_prebuilt", "cpu_s")), 3
        ),
        "ratio_of_medians_vs_native_floor": round(floor_wall / store_wall, 3),
        # the native WAL line (_rowsnative): python-line store time / store time, per trial
        "native_line_speedup_median": round(
            statistics.median(ratios("store", "store_python_line", "wall_s")), 3
        ),
        "native_line_speedup_cpu_median": round(
            statistics.median(ratios("store", "store_python_line", "cpu_s")), 3
        ),
        "python_line_ratio_vs_native_floor": round(
            statistics.median(ratios("store_python_line", "floor", "wall_s")), 3
        ),
        # the exactly-once check: store time / store-without-check time, and its share
        "check_cost_ratio_median": round(statistics.median(check_wall), 3),
        "check_cost_ratio_per_trial": check_wall,
        "check_share_of_store_time": round(1 - 1 / statistics.median(check_wall), 3),
        "check_share_of_store_cpu": round(1 - 1 / statistics.median(check_cpu), 3),
        "goal_ratio": 0.8,
        "goal_records_per_s": 50_000,
    }


SEED_SQL = """
INSERT INTO otel_guard.runs (run_id, parent_run_id, tenant, agent, status, reason, message,
  started_at, ended_at, elapsed_ms, deadline_ms, steps, model_calls, tool_calls, tool_attempts,
  input_tokens, output_tokens, reasoning_tokens, cached_tokens, cost_usd, last_tool,
  last_action_hash, loop_hits, partial_result, recoverable, price_book_version, decided_by, trace_id)
SELECT concat('seed-', toString(number)), NULL, concat('tenant-', toString(number % 20)),
  concat('agent-', toString(number % 7)),
  ['completed','terminated','terminated','terminated','failed','cancelled','degraded'][number % 7 + 1],
  ['final_answer','max_steps','loop_detected','cost_budget','agent_lost','operator_cancel','missing_evidence'][number % 7 + 1],
  'seeded', now64(3) - toIntervalMillisecond(number * 600 + 30000), now64(3) - toIntervalMillisecond(number * 600),
  number % 120000, 120000, 1 + number % 60, 1 + number % 60, number % 90, number % 95,
  100 + (number * 7919) % 200000, 10 + number % 9000, 0, 0,
  if(number % 11 = 0, NULL, (number % 1000) / 1000), 'search', '', number % 4, 0, 0, '2026-11', 'sdk', hex(number)
FROM numbers({n})
"""

DASHBOARD = {
    # Grafana-style panels over the last 7 days ($__timeFilter expanded)
    "stop_reasons_over_time_5m": """
        SELECT toStartOfInterval(minute, INTERVAL 300 SECOND) AS t, reason, sum(runs)
        FROM otel_guard.stop_reasons_1m WHERE minute >= now() - INTERVAL 7 DAY
        GROUP BY t, reason ORDER BY t""",
    "cost_by_outcome": """
        SELECT status, reason, sum(cost_usd_sum), quantilesMerge(0.5, 0.95, 0.99)(cost_usd_q)[2]
        FROM otel_guard.stop_reasons_1m WHERE minute >= now() - INTERVAL 7 DAY
        GROUP BY status, reason ORDER BY 3 DESC""",
    "p95_steps_by_agent": """
        SELECT agent, quantilesMerge(0.5, 0.95, 0.99)(steps_q)[2] FROM otel_guard.stop_reasons_1m
        WHERE minute >= now() - INTERVAL 7 DAY GROUP BY agent""",
    "top_cost_runs_raw": """
        SELECT run_id, tenant, agent, reason, cost_usd, steps FROM otel_guard.runs
        WHERE ended_at >= now() - INTERVAL 1 DAY ORDER BY cost_usd DESC NULLS LAST LIMIT 20""",
    "tenant_runs_final_raw": """
        SELECT reason, count() FROM otel_guard.runs FINAL
        WHERE tenant = 'tenant-3' AND ended_at >= now() - INTERVAL 1 DAY GROUP BY reason""",
    "run_lookup_by_id": """
        SELECT * FROM otel_guard.runs WHERE run_id = 'seed-424242'""",
}


def bench_queries(data_dir: Path, seed: int, repeat: int) -> dict:
    with open_store(None, data_dir=data_dir / "query") as store:
        client = store._writer.client
        t0 = time.perf_counter()
        client.command(SEED_SQL.format(n=seed))
        seed_s = time.perf_counter() - t0
        assert int(store.query("SELECT sum(runs) FROM otel_guard.stop_reasons_1m")[0][0]) == seed
        agg_rows = int(store.query("SELECT count() FROM otel_guard.stop_reasons_1m")[0][0])
        out: dict = {
            "seeded_runs": seed,
            "seed_s": round(seed_s, 2),
            "seed_span_days": round(seed * 0.6 / 86400, 1),
            "stop_reasons_1m_rows": agg_rows,  # 20 tenants x 7 agents: little to collapse
            "p95_ms": {},
        }
        day = time.time() - 86400

        def timed(fn) -> float:
            fn()  # warm
            samples = []
            for _ in range(repeat):
                t = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - t) * 1000)
            return round(p95(samples), 2)

        out["p95_ms"]["report_all_hourly"] = timed(lambda: store.report(bucket_s=3600))
        out["p95_ms"]["report_24h_tenant"] = timed(
            lambda: store.report(since=day, tenant="tenant-3")
        )
        for name, sql in DASHBOARD.items():
            out["p95_ms"][name] = timed(lambda sql=sql: store.query(sql))
    return out


def bench_dedup(data_dir: Path, seed: int, batches: int = 10, batch: int = 10_000) -> dict:
    """The exactly-once check's cost per batch with ``seed`` runs already stored (uuid-like
    ids, as the SDK makes them: every lookup touches every granule)."""
    with open_store(None, data_dir=data_dir / "dedup") as store:
        client = store._writer.client
        client.command(
            SEED_SQL.replace(
                "concat('seed-', toString(number))", "lower(hex(MD5(toString(number))))"
            ).format(n=seed)
        )
        committed = CommittedRuns("otel_guard")
        t0 = time.perf_counter()
        loaded = committed.load(client)
        load_s = time.perf_counter() - t0
        stored = [r[0] for r in store.query("SELECT run_id FROM otel_guard.runs LIMIT 1000")]
        fresh_ms, repeat_ms, ch_only_ms, positives = [], [], [], 0
        for b in range(batches):
            ids = [uuid.uuid4().hex for _ in range(batch)]
            before = committed.lookups
            t = time.perf_counter()
            assert committed.present(client, ids) == set()
            fresh_ms.append((time.perf_counter() - t) * 1000)
            positives += committed.lookups - before
            committed.add(ids)
            repeats = [uuid.uuid4().hex for _ in range(batch - 100)] + stored[
                b * 100 : b * 100 + 100
            ]
            t = time.perf_counter()
            assert len(committed.present(client, repeats)) == 100
            repeat_ms.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()  # the naive alternative: ask ClickHouse about every id
            for i in range(0, batch, 1000):
                client.query(
                    "SELECT DISTINCT run_id FROM otel_guard.runs WHERE run_id IN {ids:Array(String)}",
                    parameters={"ids": ids[i : i + 1000]},
                )
            ch_only_ms.append((time.perf_counter() - t) * 1000)
    return {
        "stored_runs": loaded,
        "batch_rows": batch,
        "filter_load_s": round(load_s, 2),
        "filter_bytes": committed.filter_bytes,
        "check_fresh_batch_ms_median": round(statistics.median(fresh_ms), 2),
        "check_batch_with_100_repeats_ms_median": round(statistics.median(repeat_ms), 2),
        "clickhouse_lookup_queries_per_fresh_batch": round(positives / batches, 2),
        "clickhouse_only_check_ms_median": round(statistics.median(ch_only_ms), 2),
    }


def bench_run_line(n: int, trials: int) -> dict:
    """``run_line`` alone (the WAL line of a ``runs`` row), native against ``_py_line`` and
    against msgspec (checked and unchecked, ``_msgspec_line``), interleaved over the trials:
    CPU microseconds per record of the calling thread."""
    from _msgspec_line import lines

    recs = outcomes(n, time.time(), prefix="line")
    candidates = lines()
    samples: dict[str, list[float]] = {"native": [], "python": [], **{k: [] for k in candidates}}
    for _ in range(trials):
        for name in samples:
            before = _rows.use_native(name == "native")
            try:
                line, t0 = candidates.get(name, _rows.run_line), time.thread_time()
                for o in recs:
                    line(o)
                samples[name].append((time.thread_time() - t0) / n * 1e6)
            finally:
                _rows.use_native(before)
    med = {k: statistics.median(v) for k, v in samples.items()}
    return {
        "native_built": _rows._NATIVE is not None,
        "cpu_us_per_record": {k: round(v, 2) for k, v in med.items()},
        "speedup_median": round(med["python"] / med["native"], 2),
        "msgspec_over_native": round(med["msgspec"] / med["native"], 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200_000, help="records per variant and trial")
    ap.add_argument("--trials", type=int, default=5, help="interleaved rounds (median)")
    ap.add_argument("--seed-runs", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--batch-rows", type=int, default=10_000, help="the writer's batch size")
    ap.add_argument("--skip-queries", action="store_true")
    ap.add_argument("--skip-dedup", action="store_true")
    ap.add_argument(
        "--gc",
        choices=("guard", "default"),
        default="guard",
        help="guard: the collector as `otel-guard serve` sets it (server/_gc.py), where the "
        "store runs; default: Python's thresholds (both apply to every variant alike)",
    )
    args = ap.parse_args()
    if args.gc == "guard":
        bound_gc_pauses()
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
        result = {
            "benchmark": "store",
            "engine": "chdb (embedded ClickHouse) via clickhouse-connect",
            "cpus": os.cpu_count(),
            "gc": args.gc,
            "run_line": bench_run_line(args.runs, args.trials),
            "ingest": bench_ingest(Path(tmp), args.runs, args.batch_rows, args.trials),
        }
        if not args.skip_dedup:
            result["dedup"] = bench_dedup(Path(tmp), args.seed_runs)
        if not args.skip_queries:
            result["queries"] = bench_queries(Path(tmp), args.seed_runs, args.repeat)
    ingest = result["ingest"]
    result["ingest_goal_met"] = (
        ingest["ratio_vs_native_floor"] >= 0.8 and ingest["records_per_s"]["store"] >= 50_000
    )
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
