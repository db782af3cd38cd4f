"""Scaling out: aggregate ingest of 2 guard replicas against 1, sharing one Redis. Prints JSON.

Each replica is ``otel-guard serve --redis URL`` (tenant budgets, run directory and directive
bus in Redis; no store) with the full policy of ``bench_ingest.py`` (run limits, loop
detection, a tenant with a concurrency cap and two rolling windows). The load is
``bench_ingest.py``'s, split the way a collector's trace-ID routing splits it: every request
of 512 spans becomes two requests of the spans of alternate runs, and each run's spans (and
its control stream, registered before the load) go to one replica.

* ``one``: one replica receives all the requests;
* ``two``: two replicas each receive their half at the same time (same total).

For each: wall time, aggregate spans/s (wall), the replicas' CPU seconds and spans per
CPU-second, the Redis server's CPU, and Redis commands per Export request (``INFO stats``
``total_commands_processed``, the scripts' inner calls excluded; heartbeats and the run
directory's renewals included). On this 2-core machine the driver, Redis and two replicas
share the cores, so the wall figure is a floor of what separate machines would do; the CPU
per span says what a replica costs.

    python benchmarks/bench_replicas_scaling.py [--requests 300] [--concurrency 8] [--trials 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import grpc
from _net import start_guard  # benchmarks/ is on sys.path when run as a script
from bench_ingest import POLICY, RUNS, build_requests, cpu_seconds, drive
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.redisstate._server import RedisServer


def split_requests(payloads: list[bytes], parts: int) -> list[list[bytes]]:
    """Each request's spans by run (trace id), routed to ``parts`` replicas: run i -> i % parts."""
    out: list[list[bytes]] = [[] for _ in range(parts)]
    for raw in payloads:
        req = otlp.ExportTraceServiceRequest.FromString(raw)
        spans = req.resource_spans[0].scope_spans[0].spans
        for p in range(parts):
            mine = [s for s in spans if int.from_bytes(s.trace_id, "big") % parts == p]
            sub = otlp.ExportTraceServiceRequest(resource_spans=[{"scope_spans": [{}]}])
            sub.resource_spans[0].scope_spans[0].spans.extend(mine)
            out[p].append(sub.SerializeToString())
    return out


def span_count(payloads: list[bytes]) -> list[int]:
    return [
        len(otlp.ExportTraceServiceRequest.FromString(p).resource_spans[0].scope_spans[0].spans)
        for p in payloads
    ]


async def register(address: str, runs: list[int]) -> tuple[object, asyncio.Queue]:
    """Attach one control stream and register ``runs``; returns once every one is admitted."""
    from guard.v1 import guard_pb2 as pb
    from guard.v1 import guard_pb2_grpc

    channel = grpc.aio.insecure_channel(address)
    queue: asyncio.Queue = asyncio.Queue()

    async def requests():
        while (item := await queue.get()) is not None:
            yield item

    call = guard_pb2_grpc.GuardControlStub(channel).Attach(requests())
    await queue.put(pb.AgentMessage(hello=pb.Hello(process_id=f"bench-{address}", tenant="acme")))
    for i in runs:
        rs = pb.RunStarted(
            run_id=f"run-{i:05d}",
            trace_id=i.to_bytes(16, "big").hex(),
            tenant="acme",
            agent="bench",
            request_id=i + 1,
        )
        await queue.put(pb.AgentMessage(run_started=rs))
    admitted = 0
    async for msg in call:
        if msg.WhichOneof("body") == "admit":
            admitted += 1
            if admitted == len(runs):
                break
        elif msg.WhichOneof("body") == "deny":
            raise RuntimeError(f"run denied on {address}: {msg.deny}")
    return channel, queue


async def redis_commands(url: str) -> int:
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(url)
    try:
        return int((await r.info("stats"))["total_commands_processed"])
    finally:
        await r.aclose()


def trial(kind: str, redis: RedisServer, cfg: str, halves: list[list[bytes]], args) -> dict:
    """One measurement: ``kind`` one|two replicas, the same total load."""
    env = {**os.environ, "OTEL_GUARD_REDIS_URL": redis.url}
    n_rep = 1 if kind == "one" else 2
    procs = [start_guard(cfg, env=env) for _ in range(n_rep)]
    try:
        addrs = [f"127.0.0.1:{port}" for _, port in procs]
        # run i lives on replica i % 2 (two), or all on the one replica
        owners = [addrs[(i % 2) % n_rep] for i in range(RUNS)]
        # each driver sends half of the requests: to its own replica, or both to the one
        loads = [(owners[0] if n_rep == 1 else addrs[p], halves[p]) for p in range(2)]

        async def go() -> tuple[float, list[float], int, int]:
            keep = [await register(a, [i for i in range(RUNS) if owners[i] == a]) for a in addrs]
            for a, pl in loads:  # warm-up through the full path
                await drive(a, pl, 4, 2)
            c0 = [cpu_seconds(p.pid) for p, _ in procs] + [cpu_seconds(redis.proc.pid)]
            r0 = await redis_commands(redis.url)
            t0 = time.perf_counter()
            per = args.concurrency // 2
            await asyncio.gather(*(drive(a, pl, args.requests // 2, per) for a, pl in loads))
            wall = time.perf_counter() - t0
            r1 = await redis_commands(redis.url)
            c1 = [cpu_seconds(p.pid) for p, _ in procs] + [cpu_seconds(redis.proc.pid)]
            for channel, queue in keep:
                queue.put_nowait(None)
                await channel.close()
            return wall, [b - a for a, b in zip(c0, c1, strict=True)], r0, r1

        wall, cpu, r0, r1 = asyncio.run(go())
    finally:
        for p, _ in procs:
            p.kill()
            p.wait(10)
    per_req = [sum(span_count(h)) / len(h) for h in halves]
    spans = round((args.requests // 2) * (per_req[0] + per_req[1]))
    guard_cpu = sum(cpu[:-1])
    exports = 2 * (args.requests // 2)
    return {
        "replicas": n_rep,
        "spans": spans,
        "wall_s": round(wall, 3),
        "spans_per_s": round(spans / wall),
        "guard_cpu_s": round(guard_cpu, 3),
        "spans_per_cpu_s": round(spans / guard_cpu) if guard_cpu > 0 else None,
        "redis_cpu_s": round(cpu[-1], 3),
        "redis_commands_per_export": round((r1 - r0) / exports, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    halves = split_requests(build_requests(numbered=False), 2)
    results: dict[str, list[dict]] = {"one": [], "two": []}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "guard.yaml"
        cfg.write_text(POLICY)
        redis = RedisServer(Path(tmp))
        redis.start()
        try:
            for _ in range(args.trials):  # interleaved, so drift hits both alike
                for kind in ("one", "two"):
                    results[kind].append(trial(kind, redis, str(cfg), halves, args))
        finally:
            redis.stop()

    def median(kind: str, key: str) -> float:
        xs = sorted(r[key] for r in results[kind])
        return xs[len(xs) // 2]

    out = {
        "benchmark": "replicas_scaling",
        "cores": os.cpu_count(),
        "requests": args.requests,
        "concurrency": args.concurrency,
        "trials": results,
        "median_spans_per_s": {k: median(k, "spans_per_s") for k in results},
        "two_vs_one": round(median("two", "spans_per_s") / median("one", "spans_per_s"), 3),
        "median_redis_commands_per_export": {
            k: median(k, "redis_commands_per_export") for k in results
        },
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
