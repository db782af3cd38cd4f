"""The tenant overshoot bound across replicas, with real agent processes (a bounded version of
``benchmarks/bench_reservations.py --parts tenant --replicas 3``).

Two replicas share a tenant's small cost window through one real redis-server; agent
processes (``tests/server/_tenant_proc.py``: the real SDK, its OTLP exporter and control
stream), half on each replica, run concurrent runs making $0.01 calls inside
``step.reserve`` until the tenant is exhausted. The bound of issue 11 holds fleet-wide: at
most one reservation past the limit. Each trial uses a fresh tenant; a last fleet starts on
the exhausted one: its runs are denied before they spend (some are registered through their
process's Hello while its stream connects: before the fix they were admitted, ran without
ceilings and were cancelled a few calls later)."""

from __future__ import annotations

import asyncio

from server._tenant_proc import fleet as agent_fleet

from .conftest import Fleet

PRICE = 0.01
LIMIT = 0.3
TRIALS = 2


async def _spent(endpoints: list[str], tenant: str) -> float:
    """One fleet of 2 agent processes x 4 runs on ``tenant`` (reserve mode, no think time),
    run until each run is stopped by the tenant's budget: what they spent."""
    lines = await asyncio.to_thread(
        agent_fleet,
        endpoints,
        tenant,
        "reserve",
        procs=2,
        runs=4,
        price=PRICE,
        think_s=0.0,
        timeout_s=60.0,
    )
    ended = [x for x in lines if x["event"] == "ended"]
    assert len(ended) == 8 and {x["reason"] for x in ended} == {"tenant_budget"}, ended
    return sum(x["cost_usd"] for x in ended)


async def test_reserve_mode_overshoots_at_most_one_reservation_across_replicas(
    fleet: Fleet, redis_url
):
    window = [{"metric": "cost_usd", "limit": LIMIT, "window_s": 3600}]
    tenants = {f"t{i}": {"rolling": window} for i in range(TRIALS)}
    await fleet.start(redis_url, "xy", tenants=tenants)
    endpoints = [fleet[n].address for n in "xy"]
    for i in range(TRIALS):
        spent = await _spent(endpoints, f"t{i}")
        assert LIMIT / 2 <= spent <= LIMIT + PRICE + 1e-9, (i, spent)
    # the tenant is exhausted now: new runs (some registered through their process's Hello,
    # while its stream connects) are denied before they spend anything
    assert await _spent(endpoints, "t0") <= PRICE + 1e-9


async def test_split_routing_stops_the_tenant_at_its_limit_never_before(fleet: Fleet, redis_url):
    """The control stream on x, the spans on y (trace-ID routing), a third replica idle: the
    run's spend counts once (its grant on x is not counted again on top of what y charged),
    so the tenant is stopped within one call of its limit, never before it."""
    limit = 0.105
    window = [{"metric": "cost_usd", "limit": limit, "window_s": 3600}]
    await fleet.start(redis_url, "xyz", tenants={"split": {"rolling": window}})
    endpoint = f"{fleet['x'].address}|{fleet['y'].address}"
    lines = await asyncio.to_thread(
        agent_fleet,
        [endpoint],
        "split",
        "reserve",
        procs=1,
        runs=1,
        price=PRICE,
        think_s=0.02,
        timeout_s=60.0,
    )
    (ended,) = [x for x in lines if x["event"] == "ended"]
    assert ended["reason"] == "tenant_budget", ended
    assert limit - PRICE - 1e-9 <= ended["cost_usd"] <= limit + 1e-9, ended
