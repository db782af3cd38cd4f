"""A replica-like process for the Redis tests: ``python _worker.py URL MODE TENANT JSON_ARGS``.

It waits at a barrier (a Redis list the parent fills) so the processes start together, does
its part through ``RedisTenantBudgets`` with ``TASKS`` concurrent connections, and prints
one JSON line with what it did.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys

import redis.asyncio as aioredis

from guard.policy import RollingLimit, TenantLimits, Usage
from guard.server._redis import RedisTenantBudgets, StateClient


def limits(args: dict) -> TenantLimits:
    return TenantLimits(
        max_concurrent_runs=args.get("cap"),
        rolling=tuple(RollingLimit(m, float(lim), float(w)) for m, lim, w in args["rolling"]),
    )


async def barrier(url: str, name: str) -> None:
    r = aioredis.Redis.from_url(url)
    await r.rpush(f"ready:{name}", 1)
    await r.blpop([f"go:{name}"], timeout=60)
    await r.aclose()


async def main(url: str, mode: str, tenant: str, args: dict) -> dict:
    tasks = int(args.get("tasks", 8))
    clients = [StateClient(url, socket_timeout_ms=10_000) for _ in range(tasks)]
    clock = (lambda: args["now"]) if "now" in args else None
    budgets = [
        RedisTenantBudgets(c, lambda t: limits(args), clock=clock, lease_s=args.get("lease_s", 30))
        for c in clients
    ]
    await barrier(url, args["barrier"])
    out: dict = {}
    if mode == "record":  # each task records `each` times 1.0 (cost_usd and steps)

        async def rec(b: RedisTenantBudgets) -> None:
            for _ in range(args["each"]):
                await b.record(tenant, Usage(steps=1, cost_usd=1.0))

        await asyncio.gather(*(rec(b) for b in budgets))
    elif mode == "admit":  # every task admits its runs on a cold tenant

        async def adm(i: int, b: RedisTenantBudgets) -> int:
            ok = 0
            for k in range(args["each"]):
                d = await b.admit(tenant, f"{args['barrier']}-{sys.argv[5]}-{i}-{k}")
                ok += not d.stop
            return ok

        out["admitted"] = sum(await asyncio.gather(*(adm(i, b) for i, b in enumerate(budgets))))
    elif mode == "reconcile":
        await budgets[0].reconcile(tenant, Usage(cost_usd=args["cost"]), runs=args["runs"])
    elif mode == "spend":  # grant, spend within the grant, release: again and again
        rng = random.Random(f"{args['seed']}-{sys.argv[5]}")

        async def spend(i: int, b: RedisTenantBudgets) -> float:
            spent = 0.0
            for k in range(args["each"]):
                run = f"{sys.argv[5]}-{i}-{k}"
                seen = 0.0
                g = await b.grant(tenant, run, need_cost_usd=rng.choice([0.0, 0.01, 0.05]))
                ceiling = g.max_cost_usd or 0.0
                for _ in range(3):
                    x = min(rng.uniform(0, 0.03), ceiling - seen)
                    if x <= 0:
                        g = await b.grant(tenant, run, need_cost_usd=0.01, seen=(seen, 0))
                        if g.exhausted:
                            break
                        ceiling = g.max_cost_usd or 0.0
                        continue
                    seen += x
                    spent += x
                    await b.record(tenant, Usage(cost_usd=x), observe=[(run, seen, 0.0)])
                await b.release(tenant, run, seen=(seen, 0.0), final=(seen, 0.0))
            return spent

        out["spent"] = sum(await asyncio.gather(*(spend(i, b) for i, b in enumerate(budgets))))
    elif mode == "hold":  # take a slot and a grant, then wait to be killed
        await budgets[0].admit(tenant, "held")
        g = await budgets[0].grant(tenant, "held", need_cost_usd=args["need"])
        print(json.dumps({"granted": g.max_cost_usd}), flush=True)
        await asyncio.sleep(3600)
    for c in clients:
        out.setdefault("round_trips", 0)
        out["round_trips"] += c.stats["round_trips"]
        await c.aclose()
    return out


if __name__ == "__main__":
    url, mode, tenant, raw = sys.argv[1:5]
    print(json.dumps(asyncio.run(main(url, mode, tenant, json.loads(raw)))), flush=True)
