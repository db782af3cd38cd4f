"""The replica's own CPU per Redis settle of one Export request: commands packed by hiredis (C,
what ``StateClient`` does) against redis-py's Python packer (what its asyncio connections do).

One settle is what ``SharedTenantBudgets.sync`` sends after one of ``bench_redis_ingest.py``'s
requests: one pipeline of one ``record`` script call per tenant (``--tenants``), each with the
request's window deltas and the spend of ``--runs-per-tenant`` runs holding grants (10: in
that benchmark's guard a record call carries ~50 arguments, by its profile). A real
``redis-server`` on loopback answers; the CPU is this process's (``time.process_time``: the client's packing, parsing and socket
work, not Redis's). The two packers alternate in ``--rounds`` rounds of ``--settles`` settles
each, in the same process; medians, and their ratio. Also reported: a single script call for
all the tenants (the same arguments in one call), the most a multi-tenant script could save
on this side (the key layout gives each tenant its own Cluster slot, so it is not built).
Prints JSON.

    python benchmarks/bench_redis_client.py [--rounds 5] [--settles 1000] [--tenants 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from guard.policy import RollingLimit, TenantLimits, Usage  # noqa: E402
from guard.server._redis import RedisTenantBudgets, StateClient  # noqa: E402
from guard.server._redis._client import _CPacked  # noqa: E402
from guard.server.tenants._redis_budgets import RecordBatch  # noqa: E402
from tests.redisstate._server import RedisServer  # noqa: E402

LIMITS = TenantLimits(
    max_concurrent_runs=100000,
    rolling=(RollingLimit("cost_usd", 1e12, 3600.0), RollingLimit("tokens", 1e15, 60.0)),
)


def _python_packed(client: StateClient) -> StateClient:
    """``client`` with redis-py's own packer again (its connections are opened lazily)."""
    pool = client._redis.connection_pool
    packed, base = pool.connection_class.__bases__  # (_CPacked, the URL's connection class)
    assert packed is _CPacked
    pool.connection_class = base
    return client


async def _settles(client: StateClient, n: int, tenants: int, runs: int, merged: bool) -> float:
    budgets = RedisTenantBudgets(client, lambda t: LIMITS)
    names = [f"t{i}" for i in range(tenants)]
    usage = Usage(steps=32, model_calls=32, input_tokens=32000, output_tokens=3200, cost_usd=0.1)
    spend = {t: [(f"{t}-run-{k}", 0.001 * k, 100.0 * k) for k in range(runs)] for t in names}

    def calls() -> list:
        if merged:  # every tenant's arguments in one call (what one script for all would send)
            flat = [o for t in names for o in spend[t]]
            return [budgets.record_call(names[0], RecordBatch(usage, flat))]
        return [budgets.record_call(t, RecordBatch(usage, spend[t])) for t in names]

    for _ in range(20):  # warm: the script loaded, the connection open
        await client.call_many(calls())
    started = time.process_time()
    for _ in range(n):
        for t, reply in zip(names, await client.call_many(calls()), strict=False):
            budgets.record_reply(t, reply)
    return (time.process_time() - started) / n


async def _run(args: argparse.Namespace) -> dict:
    arms = {"c_packed": [], "python_packed": [], "c_packed_one_call": []}
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(Path(tmp))
        redis.start()
        try:
            for _ in range(args.rounds):
                for arm in arms:
                    client = StateClient(redis.url, socket_timeout_ms=5000)
                    if arm == "python_packed":
                        _python_packed(client)
                    try:
                        cpu = await _settles(
                            client,
                            args.settles,
                            args.tenants,
                            args.runs_per_tenant,
                            merged=arm.endswith("one_call"),
                        )
                    finally:
                        await client.aclose()
                    arms[arm].append(cpu * 1e6)
        finally:
            redis.stop()
    med = {arm: statistics.median(v) for arm, v in arms.items()}
    return {
        "benchmark": "redis_client",
        "tenants": args.tenants,
        "runs_per_tenant": args.runs_per_tenant,
        "cpu_us_per_settle": {arm: round(m, 1) for arm, m in med.items()},
        "cpu_us_per_settle_all": {arm: [round(x, 1) for x in v] for arm, v in arms.items()},
        "c_vs_python": round(med["c_packed"] / med["python_packed"], 3),
        "one_call_vs_per_tenant": round(med["c_packed_one_call"] / med["c_packed"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--settles", type=int, default=1000)
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--runs-per-tenant", type=int, default=10)
    print(json.dumps(asyncio.run(_run(parser.parse_args())), indent=2))


if __name__ == "__main__":
    main()
