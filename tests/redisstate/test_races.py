"""LiteLLM's Redis spend races (shared/reference scale-out §1.2), one test per class, with real
processes against a real redis-server; and the overshoot bound across processes."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _wait import wait_until

from guard.policy import RollingLimit, TenantLimits, Usage
from guard.server._redis import RedisTenantBudgets
from guard.server.tenants._redis_lua import TENANT_LUA

WORKER = str(Path(__file__).with_name("_worker.py"))
ROOT = str(Path(__file__).resolve().parents[2])
_barriers = itertools.count()


def start_workers(srv, mode: str, tenant: str, args: dict, n: int) -> list[subprocess.Popen]:
    name = f"b{os.getpid()}-{next(_barriers)}"
    args = {**args, "barrier": name}
    env = {**os.environ, "PYTHONPATH": ROOT}
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, srv.url, mode, tenant, json.dumps(args), str(i)],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        for i in range(n)
    ]

    def ready() -> bool:
        assert all(p.poll() is None for p in procs), "a worker died"
        return int(srv.command("LLEN", f"ready:{name}")[1:].split(b"\r")[0]) >= n

    wait_until(ready, 60, "the workers to reach the barrier", interval_s=0.02)
    for _ in range(n):
        srv.command("RPUSH", f"go:{name}", "1")
    return procs


def results(procs: list[subprocess.Popen]) -> list[dict]:
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=120)
        assert p.returncode == 0, stdout
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def budgets(client, lim: TenantLimits, **kw) -> RedisTenantBudgets:
    return RedisTenantBudgets(client, lambda t: lim, **kw)


WIN = [("cost_usd", 1e9, 60.0), ("steps", 1e9, 60.0)]


async def test_window_reset_is_atomic_with_the_increment(redis_server, client, tenant):
    """#34733: a reset by one replica never overwrites another's increment. Each round
    starts two windows later (every bucket must be reset) and 3 processes x 8 connections
    add 1.0 at once: the total is exactly the number of adds, round after round."""
    lim = TenantLimits(rolling=tuple(RollingLimit(m, lim_, w) for m, lim_, w in WIN))
    each = 10
    for rnd in range(1, 4):
        now = rnd * 200.0
        b = budgets(client, lim, clock=lambda now=now: now - 100.0)
        await b.record(tenant, Usage(steps=500, cost_usd=500.0))  # old spend, must go
        procs = start_workers(
            redis_server, "record", tenant, {"rolling": WIN, "now": now, "each": each}, 3
        )
        results(procs)
        st = await budgets(client, lim, clock=lambda now=now: now).status(tenant)
        assert [w[2] for w in st.windows] == [3 * 8 * each] * 2


async def test_cold_counters_are_created_once_never_seeded_by_each_caller(
    redis_server, client, tenant
):
    """PR #28517: on a cold (empty) Redis, N replicas each reconciling their own counts
    give the sum of those counts, and concurrent admissions fill the cap exactly."""
    assert "INCR" not in TENANT_LUA.upper()
    rolling = [("cost_usd", 100.0, 3600.0), ("runs", 1000.0, 3600.0)]
    lim = TenantLimits(rolling=tuple(RollingLimit(m, lim_, w) for m, lim_, w in rolling))
    procs = start_workers(
        redis_server, "reconcile", tenant, {"rolling": rolling, "cost": 1.5, "runs": 2}, 3
    )
    results(procs)
    st = await budgets(client, lim).status(tenant)
    assert [w[2] for w in st.windows] == [4.5, 6.0]
    cold = tenant + "-cold"
    args = {"rolling": rolling, "cap": 10, "each": 3, "tasks": 4}
    got = results(start_workers(redis_server, "admit", cold, args, 3))
    st = await budgets(client, TenantLimits(10, lim.rolling)).status(cold)
    assert sum(r["admitted"] for r in got) == 10
    assert st.live_runs == 10 and st.windows[1][2] == 10.0


async def test_a_grant_is_given_back_on_cancel_and_on_timeout(redis_server, client, tenant):
    """#27639: a hold never leaks. A process that took a slot and a grant is killed; its
    lease lapses and the next grant/expire gives both back. A grant whose caller was
    cancelled is still released by the run's end."""
    rolling = [("cost_usd", 1.0, 3600.0)]
    lim = TenantLimits(1, tuple(RollingLimit(m, lim_, w) for m, lim_, w in rolling))
    args = {"rolling": rolling, "cap": 1, "need": 0.6, "now": 1000.0, "lease_s": 10, "tasks": 1}
    (p,) = start_workers(redis_server, "hold", tenant, args, 1)
    assert json.loads(p.stdout.readline())["granted"] == pytest.approx(0.6)
    p.send_signal(signal.SIGKILL)
    p.wait(10)
    t = [1005.0]
    b = budgets(client, lim, clock=lambda: t[0], lease_s=10)
    assert (await b.admit(tenant, "other")).metric == "concurrent_runs"  # lease still on
    assert (await b.grant(tenant, "other", need_cost_usd=0.6)).exhausted
    t[0] = 1011.0  # the dead process's lease is over
    await b.expire(tenant)
    assert (await b.status(tenant)).outstanding == (0.0, 0.0)
    assert not (await b.admit(tenant, "other")).stop
    assert not (await b.grant(tenant, "other", need_cost_usd=0.6)).exhausted

    # cancelled at every point of the call: whatever the script did, the run's release
    # gives it back (and the connection stays usable)
    cancelled = 0
    for k in range(12):
        task = asyncio.ensure_future(b.grant(tenant, f"c{k}", need_cost_usd=0.01))
        for _ in range(k):
            await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            cancelled += 1
        await b.release(tenant, f"c{k}")
    assert cancelled > 0
    await b.release(tenant, "other")
    assert (await b.status(tenant)).outstanding == (0.0, 0.0)


async def test_pending_usage_leaves_only_after_redis_has_it(redis_server, client, tenant):
    """#33872: nothing is popped before the durable write. Usage counted locally while
    Redis is down stays pending through a failed flush and reaches Redis exactly once."""
    from guard.errors import StateUnavailable
    from guard.server._redis import PendingUsage

    lim = TenantLimits(rolling=(RollingLimit("cost_usd", 100.0, 3600.0),))
    b = budgets(client, lim)
    pending = PendingUsage()
    pending.add(tenant, Usage(cost_usd=2.0), runs=1)
    pending.add(tenant + "x", Usage(cost_usd=1.0))
    redis_server.stop()
    client.retry_after_s = 0.0
    with pytest.raises(StateUnavailable):
        await pending.flush(b)
    assert len(pending) == 2 and pending.peek(tenant)[0].cost_usd == 2.0
    redis_server.start()
    assert await pending.flush(b) == 2
    assert len(pending) == 0
    assert (await b.status(tenant)).windows[0][2] == 2.0
    assert (await b.status(tenant + "x")).windows[0][2] == 1.0
    assert await pending.flush(b) == 0  # nothing twice


async def test_overshoot_across_processes_stays_within_the_limit(redis_server, client, tenant):
    """3 processes x 8 connections grant, spend within their grants, and release against
    one tenant: window used + outstanding grants never exceeds the limit."""
    rolling = [("cost_usd", 2.0, 3600.0)]
    lim = TenantLimits(rolling=tuple(RollingLimit(m, lim_, w) for m, lim_, w in rolling))
    b = budgets(client, lim)
    args = {"rolling": rolling, "each": 6, "seed": 1}
    procs = start_workers(redis_server, "spend", tenant, args, 3)
    samples = 0
    while any(p.poll() is None for p in procs):
        st = await b.status(tenant)
        assert st.windows[0][2] + st.outstanding[0] <= 2.0 + 1e-9, st
        samples += 1
    spent = sum(r["spent"] for r in results(procs))
    st = await b.status(tenant)
    assert st.windows[0][2] == pytest.approx(spent) and st.windows[0][2] <= 2.0 + 1e-9
    assert st.outstanding[0] == pytest.approx(0.0, abs=1e-9)
    assert samples > 0
