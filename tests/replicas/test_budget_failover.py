"""A run that failed over keeps its tenant slot and grant: the replica it left frees nothing.

Replica x admitted run r1 (a concurrency slot and an allowance grant in Redis, keyed by the
run id); its agent's stream drops and the agent re-registers r1 on replica z, which keeps
that slot and grant. x then learns that z holds r1 (``Lifecycle.moved_away``) and guards it
as a *remote* run. Whatever way x later ends or forgets it (the sweep after the grace, the run
span arriving at x as trace-ID routing sends it, x's drain and close), the slot and the
grant stay z's until z's run ends.

Real parts: a real redis-server, real ``GuardServer`` replicas (grpc on 127.0.0.1:0) and
hand-rolled agents speaking the real protocol."""

from __future__ import annotations

from _wait import wait_until_async
from server.conftest import Agent, span, trace_id_of

from guard.policy import RollingLimit, TenantLimits
from guard.server._redis import RedisTenantBudgets, StateClient
from guard.v1 import guard_pb2 as pb

ACME = {
    "max_concurrent_runs": 1,
    "rolling": [{"metric": "cost_usd", "limit": 1.0, "window_s": 3600}],
}
GRACE_S = 3.0  # longer than the directory heartbeat (1 s) that tells x where r1 went
LIMITS = TenantLimits(max_concurrent_runs=1, rolling=(RollingLimit("cost_usd", 1.0, 3600.0),))


async def _fleet_state(url: str, run_id: str) -> tuple[int, float | None]:
    """(the tenant's live slots, the run's grant ceiling) as Redis has them."""
    c = StateClient(url, socket_timeout_ms=5000)
    try:
        budgets = RedisTenantBudgets(c, lambda t: LIMITS)
        st = await budgets.status("acme")
        grant = await budgets.grant_of("acme", run_id)
        return st.live_runs, None if grant is None else grant.max_cost_usd
    finally:
        await c.aclose()


def _run_span(run_id: str, tid: bytes):
    attrs = {
        "gen_ai.operation.name": "invoke_agent",
        "guard.run.id": run_id,
        "guard.stop.status": "completed",
        "guard.stop.reason": "final_answer",
    }
    return span("invoke_agent bot", tid, attrs)


async def test_the_replica_a_run_left_never_frees_its_slot_or_grant(fleet, redis_url):
    await fleet.start(redis_url, "xz", tenants={"acme": ACME}, guard={"agent_grace_s": GRACE_S})
    x, z = fleet["x"].registry, fleet["z"].registry
    tid = trace_id_of(7)
    first = Agent(fleet["x"].address, tenant="acme")
    await first.connect(process_id="p1")
    assert (await first.start_run("r1", tid)).WhichOneof("body") == "admit"
    ask = pb.AllowanceRequest(run_id="r1", request_id=1, cost_usd=0.1)  # a call's reservation
    await first.outbox.put(pb.AgentMessage(allowance_request=ask))
    await first.wait_for(
        lambda m: m.WhichOneof("body") == "allowance" and m.allowance.request_id == 1
    )
    live, ceiling = await _fleet_state(redis_url, "r1")
    assert live == 1 and ceiling is not None and ceiling > 0
    await first.close()  # x's stream drops: r1 is detached on x, within the grace
    await wait_until_async(lambda: "r1" in x.detached)
    again = Agent(fleet["z"].address, tenant="acme")  # the agent fails over to z
    rs = pb.RunStarted(run_id="r1", trace_id=tid.hex(), agent="bot", tenant="acme")
    await again.connect(live_runs=[rs], process_id="p1")
    await wait_until_async(lambda: z.runs.get("r1") is not None and z.runs["r1"].connected)
    # x sees that z holds it now: a remote run on x
    await wait_until_async(lambda: x.runs.get("r1") is not None and x.runs["r1"].remote == "z")
    await x.budgets.sync()
    live, held = await _fleet_state(redis_url, "r1")  # z's re-registration may grant more
    assert live == 1 and held is not None and held >= ceiling
    # every way x ends or forgets it: the sweep (past the grace), its run span arriving at x
    # (trace-ID routing), x's drain and close
    gone_at = x.clock()  # past the grace (the state must not change)
    await wait_until_async(
        lambda: x.clock() - gone_at >= GRACE_S, GRACE_S + 10, "the grace", interval_s=0.1
    )
    x.sweep()
    spans = Agent(fleet["x"].address, tenant="acme")
    await spans.export(_run_span("r1", tid))  # awaits x's sync with Redis
    assert "r1" not in x.runs and x.stats.get("remote_ends") == 1
    await x.budgets.sync()
    await spans.close()
    await fleet["x"].stop(drain_s=1.0)
    assert await _fleet_state(redis_url, "r1") == (1, held)
    # the tenant's one slot is r1's, held through z: a second run is denied
    second = await again.start_run("r2", trace_id_of(8))
    assert second.WhichOneof("body") == "deny" and second.deny.reason == "tenant_budget"
    # z's run ends: now the slot and the grant go back
    await again.end_run("r1")
    await wait_until_async(lambda: "r1" not in z.runs)
    await z.budgets.sync()
    live, ceiling = await _fleet_state(redis_url, "r1")
    assert live == 0 and ceiling is None
    assert (await again.start_run("r3", trace_id_of(9))).WhichOneof("body") == "admit"
    await again.close()
