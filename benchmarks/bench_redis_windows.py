"""Redis-backed tenant budgets (``guard.server._redis``): round trips, latency, server cost,
throughput and memory, against a real redis-server on loopback. Prints JSON.

* **record**: one Export request's usage of one tenant (window deltas + the cumulative spend
  of 8 touched runs) = one EVALSHA, one round trip; and a request of 4 tenants through
  ``record_many`` (one pipeline). p50/p99 ms at concurrency 1; round trips and Redis
  commands per request (``INFO commandstats``: the script's inner commands included).
* **grant**, **admit + end**: p50/p99 ms.
* **throughput**: record calls/s with N tenants from C concurrent connections of this one
  Python process (the client is the bottleneck here), and the server-side cost per call
  (``usec_per_call`` of evalsha), i.e. the ceiling of one Redis core.
* **memory**: ``MEMORY USAGE`` of a tenant's keys (4 windows of 60 buckets, full), and of the
  slot/grant keys per 1,000 live runs.

    python benchmarks/bench_redis_windows.py [--calls 2000] [--tenants 1,100,1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from guard.policy import RollingLimit, TenantLimits, Usage  # noqa: E402
from guard.server._redis import RecordBatch, RedisTenantBudgets, StateClient  # noqa: E402
from tests.redisstate._server import RedisServer  # noqa: E402

_WINDOWS = [("cost_usd", 1e9, 3600.0), ("tokens", 1e12, 3600.0), ("runs", 1e9, 3600.0)]
LIMITS = TenantLimits(100_000, tuple(RollingLimit(*w) for w in [*_WINDOWS, ("steps", 1e9, 60.0)]))


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))] * 1000, 4)


async def timed(n: int, fn) -> dict:
    lat = []
    for i in range(n):
        t = time.perf_counter()
        await fn(i)
        lat.append(time.perf_counter() - t)
    return {"p50_ms": pct(lat, 0.5), "p99_ms": pct(lat, 0.99), "calls": n}


async def commandstats(c: StateClient) -> dict[str, int]:
    info = await c.command("INFO", "commandstats")  # redis-py parses it into a dict
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()}


async def commands_per_call(c: StateClient, n: int, fn) -> dict:
    before = await commandstats(c)
    rt = c.stats["round_trips"]
    for i in range(n):
        await fn(i)
    after = await commandstats(c)
    total = sum(after.values()) - sum(before.values()) - 2  # the two INFO calls
    scripts = after.get("evalsha", 0) - before.get("evalsha", 0)
    return {
        "round_trips_per_request": (c.stats["round_trips"] - rt) / n,
        "evalsha_per_request": scripts / n,
        "redis_commands_per_request": round((total - scripts) / n, 2),
    }


def usage() -> Usage:
    return Usage(steps=1, input_tokens=900, output_tokens=120, cost_usd=0.0031, model_calls=1)


async def bench(url: str, calls: int, tenant_counts: list[int]) -> dict:
    c = StateClient(url, socket_timeout_ms=1000)
    b = RedisTenantBudgets(c, lambda t: LIMITS)
    out: dict = {"redis_server": (await c.command("INFO", "server")).get("redis_version")}
    runs = [f"run-{i}" for i in range(8)]
    for r in runs:
        await b.admit("t0", r)
        await b.grant("t0", r)
    seen = [0.0]

    async def record1(i: int) -> None:
        seen[0] += 0.0031
        obs = [(r, seen[0], seen[0] * 1000) for r in runs]
        await b.record("t0", usage(), observe=obs)

    async def record4(i: int) -> None:
        await b.record_many({f"t{k}": RecordBatch(usage()) for k in range(4)})

    out["record_1_tenant_8_runs"] = await timed(calls, record1)
    out["record_1_tenant_8_runs"].update(await commands_per_call(c, 200, record1))
    out["record_4_tenants_pipelined"] = await timed(calls, record4)
    out["record_4_tenants_pipelined"].update(await commands_per_call(c, 200, record4))
    out["grant"] = await timed(calls, lambda i: b.grant("t0", runs[i % 8], need_cost_usd=1e-6))

    async def admit_end(i: int) -> None:
        await b.admit("t1", f"a{i}")
        await b.release("t1", f"a{i}", free_slot=True)

    out["admit_then_end"] = await timed(calls, admit_end)

    # throughput: record calls/s with N tenants from C connections
    tp = []
    for n_tenants in tenant_counts:
        for conc in (1, 16):
            clients = [StateClient(url, socket_timeout_ms=2000) for _ in range(conc)]
            bs = [RedisTenantBudgets(x, lambda t: LIMITS) for x in clients]
            per = max(50, calls // conc)

            async def worker(k: int, bb: RedisTenantBudgets, per: int = per, n=n_tenants) -> None:
                for i in range(per):
                    await bb.record(f"tp{(k * per + i) % n}", usage())

            await c.command("CONFIG", "RESETSTAT")
            t = time.perf_counter()
            await asyncio.gather(*(worker(k, bb) for k, bb in enumerate(bs)))
            dt = time.perf_counter() - t
            info = await c.command("INFO", "commandstats")
            usec = float(info.get("cmdstat_evalsha", {}).get("usec_per_call", 0.0))
            tp.append(
                {
                    "tenants": n_tenants,
                    "connections": conc,
                    "calls_per_s": round(per * conc / dt),
                    "server_usec_per_call": usec,
                    "server_ceiling_calls_per_s": round(1e6 / usec) if usec else None,
                }
            )
            for x in clients:
                await x.aclose()
    out["throughput"] = tp

    # memory: a tenant with full windows (every bucket used), and 1k live runs with grants
    t = [1_000_000.0]
    bm = RedisTenantBudgets(c, lambda x: LIMITS, clock=lambda: t[0])
    for _ in range(60):
        await bm.record("mem", usage())
        t[0] += 60.0  # one bucket of the hour windows (and of the minute window: wraps)
    keys = await c.command("KEYS", "og:{mem}:*")
    per_key = {k.split(":", 2)[2]: int(await c.command("MEMORY", "USAGE", k)) for k in keys}
    out["memory_tenant_full_windows_bytes"] = {"total": sum(per_key.values()), **per_key}
    used0 = int((await c.command("INFO", "memory"))["used_memory"])
    for i in range(1000):
        await bm.admit("live", f"run-{i:06d}-0123456789abcdef")
        await bm.grant("live", f"run-{i:06d}-0123456789abcdef")
    used1 = int((await c.command("INFO", "memory"))["used_memory"])
    keys = await c.command("KEYS", "og:{live}:*")
    per_key = {k.split(":", 2)[2]: int(await c.command("MEMORY", "USAGE", k)) for k in keys}
    out["memory_1k_live_runs_bytes"] = {
        "keys_total": sum(per_key.values()),
        "used_memory_delta": used1 - used0,
        "per_run": round(sum(per_key.values()) / 1000),
        **per_key,
    }
    out["client_stats"] = dict(c.stats)
    await c.aclose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--tenants", default="1,100,1000")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        srv = RedisServer(Path(tmp))
        srv.start()
        try:
            res = asyncio.run(bench(srv.url, args.calls, [int(x) for x in args.tenants.split(",")]))
        finally:
            srv.stop()
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
