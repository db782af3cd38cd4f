"""Redis unreachable, slow, or restarted empty: one error type, fast; what a restart loses."""

from __future__ import annotations

import re
import socket

import pytest

from guard.errors import GuardUnavailable, StateUnavailable
from guard.policy import RollingLimit, TenantLimits, Usage
from guard.server._redis import RecordBatch, RedisTenantBudgets, StateClient

LIM = TenantLimits(
    max_concurrent_runs=5,
    rolling=(RollingLimit("cost_usd", 10.0, 3600.0), RollingLimit("runs", 100.0, 3600.0)),
)


def every_call(b: RedisTenantBudgets, tenant: str) -> list:
    return [
        lambda: b.admit(tenant, "r"),
        lambda: b.run_ended(tenant, "r"),
        lambda: b.record(tenant, Usage(cost_usd=1.0)),
        lambda: b.record_many({tenant: RecordBatch(Usage(steps=1))}),
        lambda: b.grant(tenant, "r", need_cost_usd=1.0),
        lambda: b.grant_of(tenant, "r"),
        lambda: b.release(tenant, "r", final=(1.0, 0.0)),
        lambda: b.expire(tenant),
        lambda: b.heartbeat({tenant: ["r"]}),
        lambda: b.status(tenant),
        lambda: b.exhausted(tenant),
        lambda: b.reconcile(tenant, Usage(cost_usd=1.0)),
    ]


async def test_redis_down_every_call_raises_state_unavailable(redis_server, client, tenant):
    b = RedisTenantBudgets(client, lambda t: LIM)
    assert not (await b.admit(tenant, "r")).stop and b.healthy
    redis_server.stop()
    client.retry_after_s = 0.0  # each call really tries the network
    for call in every_call(b, tenant):
        with pytest.raises(StateUnavailable) as info:
            await call()
        assert isinstance(info.value, GuardUnavailable) and "unavailable" in str(info.value)
        assert not b.healthy
    # within the pause after a failure, calls fail without touching the network
    client.retry_after_s = 3600.0
    with pytest.raises(StateUnavailable):
        await b.status(tenant)
    before = client.stats["round_trips"]
    for call in every_call(b, tenant):
        with pytest.raises(StateUnavailable):
            await call()
    assert client.stats["round_trips"] == before and client.stats["fast_fail"] >= 12
    redis_server.start()
    assert await client.ping() and b.healthy  # a probe ends the pause


async def test_a_redis_that_never_answers_times_out_into_state_unavailable(tenant):
    with socket.socket() as s:  # accepts connections (backlog) and never replies
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        c = StateClient(f"redis://127.0.0.1:{s.getsockname()[1]}/0", socket_timeout_ms=50)
        b = RedisTenantBudgets(c, lambda t: LIM)
        with pytest.raises(StateUnavailable, match=r"(?i)timeout"):
            await b.record(tenant, Usage(cost_usd=1.0))
        assert not b.healthy
        await c.aclose()


async def test_redis_restarted_empty_loses_windows_slots_and_grants_until_reconciled(
    redis_server, client, tenant
):
    b = RedisTenantBudgets(client, lambda t: LIM)
    for r in ("a", "b"):
        assert not (await b.admit(tenant, r)).stop
    await b.grant(tenant, "a", need_cost_usd=2.0)
    await b.record(tenant, Usage(cost_usd=4.0), observe=[("a", 1.0, 0.0)])
    st = await b.status(tenant)
    assert (st.live_runs, [w[2] for w in st.windows]) == (2, [4.0, 2.0])
    noscript = client.stats["noscript"]
    redis_server.restart()
    client.retry_after_s = 0.0
    with pytest.raises(StateUnavailable):  # the old connection broke
        await b.status(tenant)
    st = await b.status(tenant)  # the script cache was empty too: NOSCRIPT -> loaded again
    assert client.stats["noscript"] == noscript + 1
    assert (st.live_runs, [w[2] for w in st.windows], st.outstanding) == (0, [0.0, 0.0], (0, 0))
    assert await b.grant_of(tenant, "a") is None
    # the replica adds back what it counted and re-claims its live runs
    await b.reconcile(tenant, Usage(cost_usd=4.0), runs=2, live=["a", "b"])
    st = await b.status(tenant)
    assert (st.live_runs, [w[2] for w in st.windows]) == (2, [4.0, 2.0])
    g = await b.grant(tenant, "a", seen=(1.0, 0.0))  # the entry comes back from its usage
    assert g.max_cost_usd == pytest.approx(1.0)
    g = await b.grant(tenant, "a", need_cost_usd=0.5, seen=(1.0, 0.0))
    assert g.max_cost_usd == pytest.approx(1.5)


async def test_keys_share_the_tenant_hash_tag_expire_and_never_mix_tenants(redis_server, client):
    b = RedisTenantBudgets(client, lambda t: LIM, lease_s=30.0)
    names = ["a", "a}:b", "a{x}", "a:slots", "a%7D", "ü/ä"]
    for t in names:
        await b.admit(t, "r1")
        await b.grant(t, "r1", need_cost_usd=1.0)
        await b.record(t, Usage(cost_usd=1.0))
    keys = [k.decode() for k in redis_server_keys(redis_server)]
    tags = {re.match(r"og:\{([^}]*)\}:", k).group(1) for k in keys}
    assert len(tags) == len(names)  # injective: one tag per tenant, no key shared
    assert len(keys) == 6 * len(names)  # agg, slots, grants, exp, 2 windows
    for k in keys:
        ttl = int(redis_server.command("PTTL", k)[1:].split(b"\r")[0])
        assert 0 < ttl <= (3600 + 60) * 1000, (k, ttl)
    for t in names:
        st = await b.status(t)
        assert st.live_runs == 1 and st.windows[0][2] == 1.0


def redis_server_keys(srv) -> list[bytes]:
    raw = srv.command("KEYS", "og:*")
    return [line for line in raw.split(b"\r\n")[1:] if line and not line.startswith(b"$")]


async def test_heartbeat_keeps_slots_past_the_lease_and_a_dead_replica_frees_them(client, tenant):
    t = [0.0]
    b = RedisTenantBudgets(
        client, lambda x: TenantLimits(1, LIM.rolling), lease_s=10.0, clock=lambda: t[0]
    )
    assert not (await b.admit(tenant, "alive")).stop
    for step in range(1, 4):
        t[0] = step * 8.0  # each time before the lease ends
        await b.heartbeat({tenant: ["alive"]})
        assert (await b.admit(tenant, "other")).metric == "concurrent_runs"
    t[0] += 10.0  # no heartbeat: the replica died
    assert not (await b.admit(tenant, "other")).stop
