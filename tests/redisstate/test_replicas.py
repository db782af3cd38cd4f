"""Replicas sharing tenant budgets through one real redis-server (``GuardServer(redis_url=)``).

Two replicas enforce a tenant's window and its concurrency cap once between them; a dead
replica's slots come back after their lease; an Export request costs one Redis round trip
whatever its tenants; with Redis gone a replica keeps guarding on its local windows, counts
the outage once and reconciles what it counted exactly once; ``guard.fail_closed`` denies new
runs instead; allowance grants to runs on both replicas come out of the one window. The
agents are raw control-stream clients (``tests/server/conftest.Agent``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from _wait import wait_until_async
from server.conftest import Agent, config, model_span, trace_id_of

from guard.policy import RollingLimit, TenantLimits
from guard.server import GuardServer, MemorySink
from guard.server._redis import RedisTenantBudgets, StateClient
from guard.v1 import guard_pb2 as pb

ACME = {"rolling": [{"metric": "cost_usd", "limit": 1.0, "window_s": 3600}]}


@contextlib.asynccontextmanager
async def replicas(url: str, n: int = 2, **policy) -> AsyncIterator[list[GuardServer]]:
    # a live Redis on a loaded machine can take longer than the default 100 ms to connect,
    # which the replicas would take for Redis down (fail_closed then denies the first run)
    policy["guard"] = {"redis_timeout_ms": 2000.0, **policy.get("guard", {})}
    servers = []
    try:
        for i in range(n):
            srv = GuardServer(
                config(**policy),
                listen="127.0.0.1:0",
                sink=MemorySink(),
                redis_url=url,
                guard_id=f"r{i + 1}",
            )
            servers.append(await srv.start())
        yield servers
    finally:
        for srv in servers:
            await srv.stop(drain_s=1.0)


async def fleet_sum(url: str, tenant: str, limits: TenantLimits) -> float:
    """The tenant's first window as Redis has it (a client of its own, not the replicas')."""
    c = StateClient(url, socket_timeout_ms=5000)
    try:
        return (await RedisTenantBudgets(c, lambda t: limits).status(tenant)).windows[0][2]
    finally:
        await c.aclose()


def cost(run: str, n: int, usd: float):
    return model_span(run, trace_id_of(n), **{"guard.cost.usd": usd})


def is_cancel(m) -> bool:
    return m.WhichOneof("body") == "cancel"


async def test_two_replicas_enforce_a_tenant_window_once(redis_url):
    async with replicas(redis_url, tenants={"acme": ACME}) as (r1, r2):
        a, b = Agent(r1.address), Agent(r2.address)
        await a.connect(process_id="A")
        await b.connect(process_id="B")
        assert (await a.start_run("a1", trace_id_of(1))).WhichOneof("body") == "admit"
        assert (await b.start_run("b1", trace_id_of(2))).WhichOneof("body") == "admit"
        await a.export(cost("a1", 1, 0.6))
        assert not a.directives("cancel")
        # replica 2 alone has seen 0.5 of a 1.0 window: the fleet has seen 1.1
        await b.export(cost("b1", 2, 0.5))
        cb = await b.wait_for(is_cancel)
        assert cb.cancel.reason == "tenant_budget" and "1.1" in cb.cancel.detail
        # replica 1 cuts its run at its next request of the tenant, and denies new ones
        await a.export(cost("a1", 1, 0.01))
        assert (await a.wait_for(is_cancel)).cancel.reason == "tenant_budget"
        third = await a.start_run("a2", trace_id_of(3))
        assert third.WhichOneof("body") == "deny" and third.deny.reason == "tenant_budget"
        lim = TenantLimits(rolling=(RollingLimit("cost_usd", 1.0, 3600.0),))
        assert await fleet_sum(redis_url, "acme", lim) == pytest.approx(1.11)
        # either replica's admin shows the fleet's window
        (tb,) = (await r2.registry.budgets.fleet_status("acme"),)
        assert tb.exhausted and tb.windows[0].used == pytest.approx(1.11)
        await a.close()
        await b.close()


async def test_concurrency_cap_holds_across_replicas(redis_url):
    tenants = {"acme": {"max_concurrent_runs": 2}}
    async with replicas(redis_url, tenants=tenants) as (r1, r2):
        a, b = Agent(r1.address), Agent(r2.address)
        await a.connect(process_id="A")
        await b.connect(process_id="B")
        assert (await a.start_run("a1", trace_id_of(1))).WhichOneof("body") == "admit"
        assert (await b.start_run("b1", trace_id_of(2))).WhichOneof("body") == "admit"
        for agent, rid in ((a, "a2"), (b, "b2")):  # the third is denied wherever it starts
            third = await agent.start_run(rid, trace_id_of(3))
            assert third.WhichOneof("body") == "deny", third
            assert third.deny.reason == "tenant_budget" and "2" in third.deny.detail
        # a re-registration (failover) keeps its slot: it is not a new run
        moved = await b.start_run("a1", trace_id_of(1))
        assert moved.WhichOneof("body") == "admit"
        await a.end_run("a1")
        await b.end_run("a1")
        await wait_until_async(lambda: "a1" not in r2.registry.runs)
        await wait_until_async(lambda: "a1" not in r1.registry.runs)
        assert (await b.start_run("b3", trace_id_of(4))).WhichOneof("body") == "admit"
        await a.close()
        await b.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_dead_replicas_slots_come_back_after_the_lease(redis_url, tmp_path: Path):
    policy = {"tenants": {"acme": {"max_concurrent_runs": 2}}, "guard": {"slot_lease_s": 3}}
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    port = _free_port()
    args = [sys.executable, "-m", "guard.cli", "serve", "--redis", redis_url, "--no-store"]
    args += ["--listen", f"127.0.0.1:{port}", "--config", str(tmp_path / "policy.yaml")]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        agents: list[Agent] = []

        async def connected() -> Agent | None:  # until the replica process listens
            agents.append(Agent(f"127.0.0.1:{port}"))
            try:
                await agents[-1].connect(process_id="A")
            except Exception:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                await agents.pop().close()
                return None
            return agents[-1]

        a = await wait_until_async(connected, 15, "the replica process to listen", interval_s=0.05)
        for i in (1, 2):
            assert (await a.start_run(f"a{i}", trace_id_of(i))).WhichOneof("body") == "admit"
        os.kill(proc.pid, signal.SIGKILL)  # the replica dies holding two slots
        proc.wait(10)
        async with replicas(redis_url, n=1, **policy) as (r2,):
            b = Agent(r2.address)
            await b.connect(process_id="B")
            first = await b.start_run("b0", trace_id_of(9))
            assert first.WhichOneof("body") == "deny" and first.deny.reason == "tenant_budget"
            ids = iter(range(10, 1 << 20))

            async def admitted() -> bool:
                n = next(ids)
                got = await b.start_run(f"b{n}", trace_id_of(n))
                return got.WhichOneof("body") == "admit"

            # the dead replica's leases lapse: a new run is admitted again
            await wait_until_async(admitted, 15, "a run admitted again", interval_s=0.1)
            await b.close()
        await a.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


async def test_one_redis_round_trip_per_export_request(redis_url):
    tenants = {"acme": ACME, "globex": ACME}
    async with replicas(redis_url, n=1, tenants=tenants, guard={"slot_lease_s": 600}) as (r1,):
        a = Agent(r1.address)
        await a.connect()
        await a.start_run("a1", trace_id_of(1))
        await a.start_run("g1", trace_id_of(2), tenant="globex")
        before = r1.figures()
        requests = 5
        for _ in range(requests):  # each request carries spans of both tenants
            await a.export(cost("a1", 1, 0.01), cost("g1", 2, 0.01), cost("a1", 1, 0.01))
        after = r1.figures()
        assert after["redis_round_trips"] - before["redis_round_trips"] == requests
        assert after["redis_calls"] - before["redis_calls"] == 2 * requests  # one per tenant
        assert after["redis_errors"] == 0
        lim = TenantLimits(rolling=(RollingLimit("cost_usd", 1.0, 3600.0),))
        assert await fleet_sum(redis_url, "acme", lim) == pytest.approx(0.1)
        assert await fleet_sum(redis_url, "globex", lim) == pytest.approx(0.05)
        await a.close()


async def test_redis_down_local_windows_guard_then_reconciled_once(redis_server, redis_url):
    async with replicas(redis_url, n=1, tenants={"acme": ACME}) as (r1,):
        a = Agent(r1.address)
        await a.connect()
        await a.start_run("a1", trace_id_of(1))
        await a.export(cost("a1", 1, 0.5))
        lim = TenantLimits(rolling=(RollingLimit("cost_usd", 1.0, 3600.0),))
        assert await fleet_sum(redis_url, "acme", lim) == pytest.approx(0.5)
        redis_server.command("SAVE")  # it comes back with what it had (refused meanwhile)
        redis_server.stop()
        await a.export(cost("a1", 1, 0.25))
        assert not a.directives("cancel")
        # the local window (this replica's 0.5 + 0.25 + 0.25) still stops the run
        await a.export(cost("a1", 1, 0.25))
        assert (await a.wait_for(is_cancel)).cancel.reason == "tenant_budget"
        assert r1.figures()["redis_fail_open_periods"] == 1  # one outage, several failures
        assert r1.figures()["redis_errors"] >= 1
        redis_server.start()
        await wait_until_async(lambda: r1.figures()["redis_reconciled_tenants"] == 1, 10)
        # 0.5 before the outage + 0.5 reconciled: nothing lost, nothing counted twice
        assert await fleet_sum(redis_url, "acme", lim) == pytest.approx(1.0)
        assert len(r1.registry.budgets.pending) == 0
        await a.close()


async def test_fail_closed_denies_new_runs_while_live_ones_go_on(redis_server, redis_url):
    guard = {"fail_closed": True}
    async with replicas(redis_url, n=1, tenants={"acme": ACME}, guard=guard) as (r1,):
        a = Agent(r1.address)
        await a.connect()
        assert (await a.start_run("a1", trace_id_of(1))).WhichOneof("body") == "admit"
        redis_server.stop()
        denied = await a.start_run("a2", trace_id_of(2))
        assert denied.WhichOneof("body") == "deny" and denied.deny.reason == "error"
        assert "tenant budgets unavailable: redis 127.0.0.1:" in denied.deny.detail
        assert "unreachable (guard.fail_closed)" in denied.deny.detail
        # the live run goes on, guarded by the local window
        await a.export(cost("a1", 1, 0.3))
        assert not a.directives("cancel") and "a1" in r1.registry.runs
        await a.export(cost("a1", 1, 0.7))
        assert (await a.wait_for(is_cancel)).cancel.reason == "tenant_budget"
        assert r1.figures()["redis_fail_closed_denials"] == 1
        await a.close()


async def ask(agent: Agent, run_id: str, request_id: int, cost_usd: float):
    """An AllowanceRequest and its answer."""
    req = pb.AllowanceRequest(run_id=run_id, request_id=request_id, cost_usd=cost_usd)
    await agent.outbox.put(pb.AgentMessage(allowance_request=req))
    msg = await agent.wait_for(
        lambda m: m.WhichOneof("body") == "allowance" and m.allowance.request_id == request_id
    )
    return msg.allowance


async def test_allowances_come_out_of_the_fleets_window(redis_url):
    """Runs on two replicas ask for more until refused: what both replicas granted together
    stays within the tenant's one limit (each replica alone would grant up to all of it)."""
    async with replicas(redis_url, tenants={"acme": ACME}) as (r1, r2):
        agents = [Agent(r1.address), Agent(r2.address)]
        runs = {}
        for k, agent in enumerate(agents):
            await agent.connect(process_id=f"P{k}")
            for i in range(3):
                rid = f"r{k}{i}"
                assert (await agent.start_run(rid, trace_id_of(10 * k + i + 1))).admit
                runs[rid] = agent
        # the first grant arrives with the Admit, before it
        first = [m.WhichOneof("body") for m in agents[0].messages][1:3]
        assert first == ["allowance", "admit"]
        ceilings = {rid: 0.0 for rid in runs}
        refused, n = set(), 100
        while len(refused) < len(runs):
            for rid, agent in runs.items():
                if rid in refused:
                    continue
                n += 1
                al = await ask(agent, rid, n, 0.1)
                ceilings[rid] = max(ceilings[rid], al.max_cost_usd)
                if al.exhausted:
                    refused.add(rid)
                    assert "acme" in al.detail and "cost_usd" in al.detail
        total = sum(ceilings.values())
        assert 0.9 <= total <= 1.0 + 1e-9, ceilings
        assert r1.figures()["allowance_grants"] > 0 and r2.figures()["allowance_grants"] > 0
        for agent in agents:
            await agent.close()
