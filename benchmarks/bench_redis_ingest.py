"""Ingest of one replica with Redis-backed tenant budgets, against the same guard without Redis.

The load is ``bench_ingest.py``'s (512-span requests of guarded steps, model calls carrying
tokens, 256 live runs registered over a control stream), spread over ``--tenants`` tenants,
each with a rolling ``cost_usd`` and a rolling ``tokens`` window. The same policy file is
served by ``otel-guard serve`` without Redis (``memory``) and with ``OTEL_GUARD_REDIS_URL``
(``redis``, one real ``redis-server`` on loopback), interleaved in ``--pairs`` pairs, and the
decode-only floor of ``bench_ingest.py`` is measured in the same run. Reports spans/s/core
(the receiver's CPU clock) both ways, their ratio per pair and the median (goal >= 0.8x), and
Redis round trips and script calls per Export request (``GuardAdmin.Stats``, over a separate
stretch of requests after the measured one). Prints JSON.

    python benchmarks/bench_redis_ingest.py [--requests 300] [--pairs 3] [--tenants 4]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc
from _net import free_port, start_guard, wait_port
from bench_ingest import RUNS, STEPS_PER_REQUEST, build_requests, drive, measure, tenant_of
from bench_ingest import __file__ as INGEST
from bench_ingest import _register_runs as register_runs

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from guard.v1 import guard_pb2 as pb  # noqa: E402
from guard.v1 import guard_pb2_grpc  # noqa: E402
from tests.redisstate._server import RedisServer  # noqa: E402

STATS_REQUESTS = 50


def policy(tenants: int) -> str:
    lines = [
        "runs: {max_steps: 1000000000, max_tokens: 1000000000000, max_cost_usd: 1000000000.0,",
        "       deadline_s: 36000}",
        "tenants:",
    ]
    for t in sorted({tenant_of(i, tenants) for i in range(tenants)}):
        lines += [
            f"  {t}:",
            "    max_concurrent_runs: 100000",
            "    rolling:",
            "      - {metric: cost_usd, limit: 1000000000000.0, window_s: 3600}",
            "      - {metric: tokens, limit: 1000000000000000.0, window_s: 60}",
        ]
    return "\n".join(lines) + "\n"


async def _figures(address: str) -> dict[str, float]:
    async with grpc.aio.insecure_channel(address) as ch:
        resp = await guard_pb2_grpc.GuardAdminStub(ch).Stats(pb.StatsRequest(), timeout=10)
    return dict(resp.figures)


async def _per_request(address: str, payloads: list[bytes], tenants: int) -> dict:
    keep = await register_runs(address, tenants)
    before = await _figures(address)
    await drive(address, payloads, STATS_REQUESTS, 1)
    after = await _figures(address)
    keep[1][1].put_nowait(None)
    await keep[0].close()
    n = STATS_REQUESTS + 2  # drive() warms up with two requests
    return {
        "round_trips_per_request": round(
            (after["redis_round_trips"] - before["redis_round_trips"]) / n, 3
        ),
        "calls_per_request": round((after["redis_calls"] - before["redis_calls"]) / n, 3),
        "errors": after["redis_errors"],
        "fail_open_periods": after.get("redis_fail_open_periods", 0.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--tenants", type=int, default=4)
    args = parser.parse_args()
    payloads = build_requests(tenants=args.tenants)
    pre = functools.partial(register_runs, tenants=args.tenants)
    results: list[dict] = []
    per_request: dict | None = None
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(Path(tmp))
        redis.start()
        cfg = Path(tmp) / "guard.yaml"
        cfg.write_text(policy(args.tenants))
        try:
            fport = free_port()
            floor = subprocess.Popen(
                [sys.executable, INGEST, "--role", "floor", "--port", str(fport)]
            )
            procs.append(floor)
            wait_port(fport, floor)
            for pair in range(args.pairs):
                for mode in ("memory", "redis"):
                    env = dict(os.environ)
                    env.pop("OTEL_GUARD_REDIS_URL", None)
                    if mode == "redis":
                        redis.command("FLUSHALL")
                        env["OTEL_GUARD_REDIS_URL"] = redis.url
                    guard, port = start_guard(str(cfg), env=env)
                    procs.append(guard)
                    address = f"127.0.0.1:{port}"
                    r = measure(
                        mode, guard.pid, address, payloads, args.requests, args.concurrency, pre
                    )
                    r["pair"] = pair
                    results.append(r)
                    if mode == "redis" and per_request is None:
                        per_request = asyncio.run(_per_request(address, payloads, args.tenants))
                    guard.terminate()
                    guard.wait(20)
            results.append(
                measure("floor", floor.pid, f"127.0.0.1:{fport}", payloads, args.requests, 8)
            )
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            redis.stop()
    rate = {(r["receiver"], r.get("pair")): r["spans_per_s_per_core"] for r in results}
    ratios = [rate[("redis", i)] / rate[("memory", i)] for i in range(args.pairs)]
    floor_rate = rate[("floor", None)]
    med = {
        m: statistics.median(rate[(m, i)] for i in range(args.pairs)) for m in ("memory", "redis")
    }
    print(
        json.dumps(
            {
                "benchmark": "redis_ingest",
                "cores": os.cpu_count(),
                "tenants": args.tenants,
                "live_runs": RUNS,
                "request_spans": STEPS_PER_REQUEST * 4,
                "results": results,
                "redis_vs_memory_per_pair": [round(x, 3) for x in ratios],
                "redis_vs_memory": round(statistics.median(ratios), 3),
                "memory_vs_floor": round(med["memory"] / floor_rate, 3),
                "redis_vs_floor": round(med["redis"] / floor_rate, 3),
                "redis_per_export_request": per_request,
                "goals": {"redis_vs_memory": 0.8, "round_trips_per_request": 1},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
