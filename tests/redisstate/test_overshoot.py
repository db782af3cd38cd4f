"""The tenant overshoot bound across replicas: the three ways it was broken.

* A Hello entry still waiting for its first answer (``request_id`` set: the SDK registered
  the run while its stream was connecting) into an exhausted tenant is denied; before, it was
  admitted as a re-registration and cancelled right after, and the agent ran it meanwhile
  with no ceilings (the benchmark's reserve mode went calls over).
* A Redis blip (one reply slower than the client's timeout) does not make a replica answer
  allowance asks from its own view: that view has neither the other replicas' spend nor the
  grants the fleet holds, so it granted the tenant's window a second time. The ask waits for
  Redis instead.
* A registration that makes no run (its stream closed before the verdict) frees the slot and
  grant only when its admission took them: not a run's that lives on another replica.

Real parts: a real redis-server (stopped with SIGSTOP for a blip), real ``GuardServer``
replicas, raw control-stream agents (``tests/server/conftest.Agent``).
"""

from __future__ import annotations

import asyncio
import signal

from _wait import wait_until_async
from server.conftest import Agent, trace_id_of

from guard.policy import RollingLimit, TenantLimits
from guard.server._redis import RedisTenantBudgets, StateClient
from guard.v1 import guard_pb2 as pb

from .test_replicas import ACME, ask, cost, replicas

LIMITS = TenantLimits(rolling=(RollingLimit("cost_usd", 1.0, 3600.0),))


async def _grant_of(url: str, run_id: str):
    c = StateClient(url, socket_timeout_ms=5000)
    try:
        return await RedisTenantBudgets(c, lambda t: LIMITS).grant_of("acme", run_id)
    finally:
        await c.aclose()


async def test_a_pending_run_in_hello_into_an_exhausted_tenant_is_denied(redis_url):
    async with replicas(redis_url, tenants={"acme": ACME}) as (r1, r2):
        a = Agent(r1.address)
        await a.connect(process_id="A")
        assert (await a.start_run("a1", trace_id_of(1))).admit
        await a.export(cost("a1", 1, 1.0))  # the tenant's window is reached
        # another process registered a new run while its stream was connecting: it is in
        # its Hello, waiting for its first answer (request_id set)
        b = Agent(r2.address)
        rs = pb.RunStarted(run_id="b1", trace_id=trace_id_of(2).hex(), tenant="acme")
        rs.agent, rs.request_id = "bot", 7
        await b.connect(live_runs=[rs], process_id="B")
        msg = await b.wait_for(lambda m: m.WhichOneof("body") in ("admit", "deny"))
        assert msg.WhichOneof("body") == "deny", msg
        assert msg.deny.request_id == 7 and msg.deny.reason == "tenant_budget"
        assert "b1" not in r2.registry.runs and not b.directives("cancel")
        # a run admitted before (request_id 0: its agent reconnected) is re-registered as
        # ever: it holds its slot, and its agent has been running it
        again = pb.RunStarted(run_id="a1", trace_id=trace_id_of(1).hex(), tenant="acme")
        again.agent = "bot"
        c = Agent(r2.address)
        await c.connect(live_runs=[again], process_id="A")
        back = await c.wait_for(lambda m: m.WhichOneof("body") in ("admit", "deny"))
        assert back.WhichOneof("body") == "admit" and back.admit.run_id == "a1"
        for agent in (a, b, c):
            await agent.close()


async def _stopped(redis_server, registry) -> None:
    """Stop redis-server (SIGSTOP: connections stay open, replies stop) until ``registry``
    noticed (its calls time out), then let it go on."""
    redis_server.proc.send_signal(signal.SIGSTOP)
    try:
        await wait_until_async(lambda: registry.budgets.down, 10.0)
    finally:
        redis_server.proc.send_signal(signal.SIGCONT)


async def test_a_redis_blip_does_not_grant_the_tenants_window_again(redis_server, redis_url):
    async with replicas(redis_url, tenants={"acme": ACME}) as (r1, r2):
        agents = [Agent(r1.address), Agent(r2.address)]
        for k, agent in enumerate(agents):
            await agent.connect(process_id=f"P{k}")
            assert (await agent.start_run(f"r{k}", trace_id_of(k + 1))).admit
        n = 100
        for k in (0, 1, 0, 1):  # grants until nothing is left in the fleet's window
            while not (await ask(agents[k], f"r{k}", n := n + 1, 0.2)).exhausted:
                pass
        ceilings = {k: (await _grant_of(redis_url, f"r{k}")).max_cost_usd for k in (0, 1)}
        assert sum(ceilings.values()) <= 1.0 + 1e-9
        r1.registry.state.retry_after_s = 0.05  # retried soon after Redis answers again
        # r0 asks for more while Redis does not answer: its replica's own view has no spend
        # and no grants (it would grant all of it); the answer waits for Redis instead
        req = pb.AllowanceRequest(run_id="r0", request_id=(n := n + 1), cost_usd=0.2)
        stop = asyncio.ensure_future(_stopped(redis_server, r1.registry))
        await asyncio.sleep(0)
        await agents[0].outbox.put(pb.AgentMessage(allowance_request=req))
        await stop
        msg = await agents[0].wait_for(
            lambda m: m.WhichOneof("body") == "allowance" and m.allowance.request_id == n,
            timeout=10.0,
        )
        assert msg.allowance.exhausted, msg
        assert msg.allowance.max_cost_usd <= ceilings[0] + 1e-9
        assert r1.figures()["redis_fail_open_periods"] == 1  # counted: it was an outage
        for agent in agents:
            await agent.close()


async def test_a_registration_that_makes_no_run_frees_only_what_it_took(redis_server, redis_url):
    tenants = {"acme": {**ACME, "max_concurrent_runs": 1}}
    async with replicas(redis_url, tenants=tenants) as (r1, r2):
        z = Agent(r2.address)
        await z.connect(process_id="P")
        assert (await z.start_run("r1", trace_id_of(1))).admit  # live on r2
        held = (await _grant_of(redis_url, "r1")).max_cost_usd
        # a flapping agent registers r1 on r1 too; its stream closes before the verdict
        # (held meanwhile by a Redis blip)
        r1.registry.state.retry_after_s = 0.05
        x = Agent(r1.address)
        await x.connect(process_id="P")
        rs = pb.RunStarted(run_id="r1", trace_id=trace_id_of(1).hex(), tenant="acme")
        rs.agent, rs.request_id = "bot", 1
        stop = asyncio.ensure_future(_stopped(redis_server, r1.registry))
        await asyncio.sleep(0)
        await x.outbox.put(pb.AgentMessage(run_started=rs))
        await stop
        await x.close()
        await wait_until_async(lambda: not r1.registry.budgets.down, 10.0)
        assert "r1" not in r1.registry.runs
        await r1.registry.budgets.sync()
        # r2's run keeps its slot (a second run is denied) and its grant
        deny = await z.start_run("r2", trace_id_of(2))
        assert deny.WhichOneof("body") == "deny" and deny.deny.reason == "tenant_budget"
        grant = await _grant_of(redis_url, "r1")
        assert grant is not None and grant.max_cost_usd >= held
        await z.close()
