"""Store benchmark: run records/s into the embedded ClickHouse, and report/dashboard query p95.

Prints one JSON object. Goals (DESIGN §5): >= 50k run records/s through ``Store.write_run``
(WAL append + batching + the exactly-once check + deduplicated inserts, measured until
everything is committed), next to the floor of a bare clickhouse-connect insert of the same
rows; the cost of the exactly-once check per 10k-record batch with 1M runs already stored
(``dedup``: the committed-run-id filter plus the ClickHouse lookup of what it cannot rule
out, next to asking ClickHouse about every id); and the p95 of the report and
dashboard-style queries over 1M seeded runs.

    python benchmarks/bench_store.py [--runs 200000] [--seed-runs 1000000] [--repeat 20]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from guard.policy._types import REASON_STATUS, DecidedBy, Outcome, Reason
from guard.store import open_store
from guard.store._dedup import CommittedRuns
from guard.store._rows import encode_row, run_row
from guard.store._schema import RUN_COLUMNS

REASONS = list(Reason)


def outcomes(n: int, now: float) -> list[Outcome]:
    rng = random.Random(7)
    out = []
    for i in range(n):
        reason = REASONS[rng.randrange(len(REASONS))]
        ended = now - rng.random() * 86400
        out.append(
            Outcome(
                run_id=f"bench-{i:08d}",
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


def bench_ingest(data_dir: Path, n: int, batch_rows: int) -> dict:
    now = time.time()
    recs = outcomes(n, now)
    with open_store(None, data_dir=data_dir / "ingest", batch_rows=batch_rows) as store:
        t0 = time.perf_counter()
        for o in recs:
            store.write_run(o)
        accepted_s = time.perf_counter() - t0
        assert store.flush(300), store.counters()
        total_s = time.perf_counter() - t0
        c = store.counters()
        assert c["written"] == n and c["dropped"] == 0, c
        # floors: the same rows through bare clickhouse-connect inserts, 10k per batch, with
        # no WAL, no queue: (a) client.insert of Python rows (native format, encoded in
        # Python), (b) raw_insert of pre-encoded JSONCompactEachRow (what the writer sends).
        rows = [run_row(o) for o in outcomes(n, now + 1)]
        for r in rows:
            r[0] = "floor-" + r[0]
        blobs = [" ".join(encode_row(r) for r in rows[i : i + 10_000]) for i in range(0, n, 10_000)]
        for r in rows:
            r[7], r[8] = round(r[7] * 1000), round(r[8] * 1000)  # native DateTime64 ticks
        client = store._writer.client
        t1 = time.perf_counter()
        for i in range(0, n, 10_000):
            client.insert("otel_guard.runs", rows[i : i + 10_000], column_names=list(RUN_COLUMNS))
        floor_s = time.perf_counter() - t1
        t2 = time.perf_counter()
        for i, blob in enumerate(blobs):
            client.raw_insert(
                "otel_guard.runs",
                list(RUN_COLUMNS),
                insert_block=blob.encode(),
                fmt="JSONCompactEachRow",
                settings={"insert_deduplication_token": f"floor-{i}"},
            )
        raw_s = time.perf_counter() - t2
    return {
        "records": n,
        "batch_rows": batch_rows,
        "write_run_us": round(accepted_s / n * 1e6, 2),
        "records_per_s": round(n / total_s),
        "floor_native_insert_records_per_s": round(n / floor_s),
        "floor_raw_json_insert_records_per_s": round(n / raw_s),
        "ratio_vs_native_floor": round(floor_s / total_s, 3),
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200_000)
    ap.add_argument("--seed-runs", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--batch-rows", type=int, default=10_000, help="the writer's batch size")
    ap.add_argument("--skip-queries", action="store_true")
    ap.add_argument("--skip-dedup", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
        result = {
            "benchmark": "store",
            "engine": "chdb (embedded ClickHouse) via clickhouse-connect",
            "cpus": os.cpu_count(),
            "ingest": bench_ingest(Path(tmp), args.runs, args.batch_rows),
        }
        if not args.skip_dedup:
            result["dedup"] = bench_dedup(Path(tmp), args.seed_runs)
        if not args.skip_queries:
            result["queries"] = bench_queries(Path(tmp), args.seed_runs, args.repeat)
    result["ingest_goal_met"] = result["ingest"]["records_per_s"] >= 50_000
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
