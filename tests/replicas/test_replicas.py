"""Several replicas behave as one guard: runs whose spans reach one replica and whose control
stream another holds, fleet-wide Cancel and ListRuns, the run directory's heartbeat TTL.

Real parts: a real redis-server, real ``GuardServer`` replicas (grpc on 127.0.0.1:0) and
hand-rolled agents speaking the real protocol (control stream and OTLP export)."""

from __future__ import annotations

import contextlib
from typing import Any

import grpc
import pytest
from _wait import WaitTimeout, wait_until_async
from server.conftest import Agent, step_span, tool_span, trace_id_of

from guard.v1 import guard_pb2 as pb

LOOPY = {"runs": {"loop": {"window": 20, "repeat_threshold": 3, "no_progress_steps": 50}}}


def numbered(sp, seq: int):
    """A span as the SDK sends it when it has a control stream (guard.seq)."""
    from server.conftest import attr

    sp.attributes.append(attr("guard.seq", seq))
    return sp


async def test_decision_on_span_replica_cancels_run_on_stream_replica(fleet, redis_url):
    await fleet.start(redis_url, "xy", **LOOPY)
    x, y = fleet["x"], fleet["y"]
    agent = Agent(y.address)  # the control stream is on y
    spans = Agent(x.address)  # the spans go to x (trace-ID load balancing)
    await agent.connect()
    tid = trace_id_of(7)
    assert (await agent.start_run("r1", tid)).WhichOneof("body") == "admit"
    seq = 0
    for i in range(1, 8):
        seq += 2
        await spans.export(
            numbered(tool_span("r1", tid, "ab" * 16), seq - 1),
            numbered(step_span("r1", tid, i), seq),
        )
        with contextlib.suppress(WaitTimeout):  # no cancel yet: send the next step
            await wait_until_async(lambda: agent.directives("cancel", "r1"), 0.3)
            break
    msg = await agent.wait_for(lambda m: m.WhichOneof("body") == "cancel")
    assert msg.cancel.reason == "loop_detected"
    # x decided, y pushed it and wrote the one decision record (with the delivery latency)
    await wait_until_async(lambda: any(d.action == "cancel" for d in fleet.sinks["y"].decisions))
    rec = next(d for d in fleet.sinks["y"].decisions if d.action == "cancel")
    assert rec.reason == "loop_detected" and rec.delivery_latency_ms is not None
    assert rec.guard_id == "y"
    assert not [d for d in fleet.sinks["x"].decisions if d.action == "cancel"]
    await agent.end_run("r1", status="terminated", reason="loop_detected", decided_by="guard")
    await wait_until_async(lambda: fleet.sinks["y"].run("r1") is not None)
    # x learns from the directory that it ended, and forgets it without a record of its own
    await wait_until_async(lambda: "r1" not in x.registry.runs, 5.0)
    x.registry.sweep()
    assert [o.run_id for o in fleet.sinks["y"].runs] == ["r1"]
    assert fleet.sinks["x"].runs == []
    await agent.close()
    await spans.close()


async def _runs_on(fleet, name: str, run_ids: list[str], tenant: str = "acme") -> Agent:
    agent = Agent(fleet[name].address, tenant=tenant)
    await agent.connect(process_id=f"p-{name}")
    for n, rid in enumerate(run_ids):
        msg = await agent.start_run(rid, trace_id_of(100 + n + 10 * ord(name)))
        assert msg.WhichOneof("body") == "admit"
    return agent


async def _holds(names: Any, want: set[str]) -> bool:
    return want <= set(await names)


async def test_fleet_cancel_through_a_third_replica_and_deny_during_it(fleet, redis_url):
    await fleet.start(redis_url, "xyz")
    ax = await _runs_on(fleet, "x", ["x1", "x2"])
    ay = await _runs_on(fleet, "y", ["y1"])
    other = await _runs_on(fleet, "y", ["g1"], tenant="globex")
    replicas = fleet["z"].registry.directory.replicas  # z sees x's and y's heartbeats
    await wait_until_async(lambda: _holds(replicas(), {"x", "y"}), 10, "x, y in the directory")
    resp = await fleet.admin("z").Cancel(pb.CancelRequest(selector=pb.Selector(tenant="acme")))
    assert sorted(resp.run_ids) == ["x1", "x2", "y1"]
    for agent, rid in ((ax, "x1"), (ax, "x2"), (ay, "y1")):
        msg = await agent.wait_for(
            lambda m, rid=rid: m.WhichOneof("body") == "cancel" and m.cancel.run_id == rid
        )
        assert msg.cancel.reason == "operator_cancel"
    assert not other.directives("cancel")
    # a run of the tenant starting while the cancel is carried out is denied, on any replica
    msg = await ax.start_run("x3", trace_id_of(999))
    assert msg.WhichOneof("body") == "deny" and msg.deny.reason == "operator_cancel"
    msg = await other.start_run("g2", trace_id_of(998))  # another tenant is not touched
    assert msg.WhichOneof("body") == "admit"
    for a in (ax, ay, other):
        await a.close()


async def test_fleet_cancel_by_run_id_and_unknown_run(fleet, redis_url):
    await fleet.start(redis_url, "xy")
    ay = await _runs_on(fleet, "y", ["y1"])
    resp = await fleet.admin("x").Cancel(pb.CancelRequest(selector=pb.Selector(run_id="y1")))
    assert list(resp.run_ids) == ["y1"]
    await ay.wait_for(lambda m: m.WhichOneof("body") == "cancel")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await fleet.admin("x").Cancel(pb.CancelRequest(selector=pb.Selector(run_id="nope")))
    assert info.value.code() is grpc.StatusCode.NOT_FOUND
    await ay.close()


async def test_list_runs_through_any_replica_shows_every_run_once(fleet, redis_url):
    await fleet.start(redis_url, "xyz")
    ax = await _runs_on(fleet, "x", ["x1", "x2"])
    ay = await _runs_on(fleet, "y", ["y1"])
    for name in "xyz":
        resp = await fleet.admin(name).ListRuns(pb.ListRunsRequest())
        assert sorted((r.run_id, r.guard_id) for r in resp.runs) == [
            ("x1", "x"),
            ("x2", "x"),
            ("y1", "y"),
        ], name
        assert resp.total == 3
    # local: only what this replica holds (an operator on one replica; no fleet query)
    local = await fleet.admin("x").ListRuns(pb.ListRunsRequest(local=True))
    assert sorted(r.run_id for r in local.runs) == ["x1", "x2"] and local.total == 2
    assert not (await fleet.admin("z").ListRuns(pb.ListRunsRequest(local=True))).runs
    await ax.close()
    await ay.close()


async def _remote_run(fleet, redis_url, names: str = "xy"):
    """Replicas x, y (...); run r1's stream on y, its first span on x: x guards it as y's."""
    await fleet.start(redis_url, names, **LOOPY)
    agent = await _runs_on(fleet, "y", ["r1"])
    spans = Agent(fleet["x"].address)
    tid = trace_id_of(100 + 10 * ord("y"))
    await spans.export(numbered(step_span("r1", tid, 1), 1))
    run = fleet["x"].registry.runs.get
    await wait_until_async(lambda: run("r1") is not None and run("r1").remote == "y")
    return agent, spans, tid, run


async def test_remote_run_is_listed_once_by_its_stream_replica(fleet, redis_url):
    agent, spans, _, _ = await _remote_run(fleet, redis_url)
    resp = await fleet.admin("x").ListRuns(pb.ListRunsRequest())
    assert [(r.run_id, r.guard_id) for r in resp.runs] == [("r1", "y")]
    await agent.close()
    await spans.close()


async def test_directory_entries_lapse_when_heartbeats_stop(fleet, redis_url, redis_server):
    await fleet.start(redis_url, "xy")
    ax = await _runs_on(fleet, "x", ["x1"])
    state = fleet["y"].registry.state
    key = fleet["x"].registry.directory.key("x1")

    async def claimed() -> bool:
        return await state.pipeline([("HGET", key, "r")]) == ["x"]

    await wait_until_async(claimed, 10, "x1 claimed by x in the directory", interval_s=0.02)
    assert "x" in await fleet["y"].registry.directory.replicas()
    # x's heartbeats stop (as when its process is killed): its entries lapse within seconds
    task = fleet["x"].registry.directory._task
    task.cancel()

    async def lapsed() -> bool:
        gone = await state.pipeline([("EXISTS", key)]) == [0]
        return gone and "x" not in await fleet["y"].registry.directory.replicas()

    # ttl_s 5; bounded for a loaded machine
    await wait_until_async(lapsed, 20, "x1's entry and replica x to lapse", interval_s=0.1)
    await ax.close()


async def test_ended_run_leaves_a_tombstone(fleet, redis_url):
    await fleet.start(redis_url, "xy")
    ax = await _runs_on(fleet, "x", ["x1"])
    await ax.end_run("x1")
    await wait_until_async(lambda: fleet.sinks["x"].run("x1") is not None)
    directory = fleet["y"].registry.directory

    async def tombstone() -> Any:
        entry = (await directory.lookup(["x1"])).get("x1")
        return entry if entry is not None and entry.ended else None

    entry = await wait_until_async(tombstone, 10, "x1's tombstone", interval_s=0.02)
    assert entry.replica == "x" and entry.tenant == "acme"
    await ax.close()


async def test_fleet_admin_keeps_tenant_isolation(fleet, redis_url, monkeypatch):
    from server.conftest import AUTH, AUTH_ENV

    for k, v in AUTH_ENV.items():
        monkeypatch.setenv(k, v)
    await fleet.start(redis_url, "xyz", auth=AUTH)
    acme = Agent(fleet["x"].address, token="acme-secret", tenant="acme")
    await acme.connect()
    await acme.start_run("a1", trace_id_of(2))
    globex = Agent(fleet["y"].address, token="globex-secret", tenant="globex")
    await globex.connect(process_id="g")
    await globex.start_run("g1", trace_id_of(3))
    admin = fleet.admin("z")

    def md(token: str):
        return (("authorization", f"Bearer {token}"),)

    # a tenant token lists only its own tenant's runs, fleet-wide
    resp = await admin.ListRuns(pb.ListRunsRequest(), metadata=md("acme-secret"))
    assert [r.run_id for r in resp.runs] == ["a1"] and resp.total == 1
    # another tenant's run id answers like an unknown one
    for rid in ("g1", "nope"):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await admin.Cancel(
                pb.CancelRequest(selector=pb.Selector(run_id=rid)), metadata=md("acme-secret")
            )
        assert info.value.code() is grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await admin.Cancel(
            pb.CancelRequest(selector=pb.Selector(tenant="globex")), metadata=md("acme-secret")
        )
    assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await admin.Cancel(
            pb.CancelRequest(selector=pb.Selector(all=True)), metadata=md("acme-secret")
        )
    assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED
    # a tenant's --agent cancel reaches only its own runs on every replica
    resp = await admin.Cancel(
        pb.CancelRequest(selector=pb.Selector(agent="bot")), metadata=md("acme-secret")
    )
    assert list(resp.run_ids) == ["a1"]
    assert not globex.directives("cancel")
    # the admin token's --all reaches the whole fleet
    resp = await admin.Cancel(
        pb.CancelRequest(selector=pb.Selector(all=True)), metadata=md("admin-secret")
    )
    assert sorted(resp.run_ids) == ["a1", "g1"]
    await globex.wait_for(lambda m: m.WhichOneof("body") == "cancel")
    await acme.close()
    await globex.close()


async def test_redis_down_fleet_admin_answers_what_it_reaches_and_reclaims(
    fleet, redis_url, redis_server
):
    await fleet.start(redis_url, "xy")
    ax = await _runs_on(fleet, "x", ["x1"])
    ay = await _runs_on(fleet, "y", ["y1"])
    redis_server.stop()
    # x still guards (and cancels) the runs it holds, and says the fleet was not reached
    rpc = fleet.admin("x").Cancel(pb.CancelRequest(selector=pb.Selector(run_id="x1")))
    resp = await rpc
    assert list(resp.run_ids) == ["x1"]
    trailer = dict(await rpc.trailing_metadata())
    assert "redis unavailable" in trailer["otel-guard-partial"]
    await ax.wait_for(lambda m: m.WhichOneof("body") == "cancel")
    # Redis comes back empty: every replica writes its held entries anew
    redis_server.start()
    directory = fleet["x"].registry.directory

    async def rewritten() -> bool:
        try:
            found = await directory.lookup(["x1", "y1"])
        except Exception:  # Redis still starting
            return False
        return sorted((k, e.replica) for k, e in found.items()) == [("x1", "x"), ("y1", "y")]

    await wait_until_async(rewritten, 10, "x1, y1 written anew by x, y", interval_s=0.1)
    await ax.close()
    await ay.close()


async def test_cancel_decided_during_a_redis_blip_still_reaches_the_stream_replica(
    fleet, redis_url, redis_server
):
    agent, spans, tid, run = await _remote_run(fleet, redis_url)
    redis_server.stop()
    seq = 1
    for i in range(2, 8):  # the loop is decided on x while Redis is away
        seq += 2
        await spans.export(
            numbered(tool_span("r1", tid, "cd" * 16), seq - 1),
            numbered(step_span("r1", tid, i), seq),
        )
    assert run("r1").stop_reason is not None
    assert not agent.directives("cancel")
    redis_server.start()  # back (empty): the bus's outbox is written, y reads it
    msg = await agent.wait_for(lambda m: m.WhichOneof("body") == "cancel", timeout=10.0)
    assert msg.cancel.reason == "loop_detected"
    await wait_until_async(
        lambda: [d.action for d in fleet.sinks["y"].decisions if d.action == "cancel"] == ["cancel"]
    )
    assert not [d for d in fleet.sinks["x"].decisions if d.action == "cancel"]
    await agent.close()
    await spans.close()


async def test_spans_of_another_tenants_remote_run_are_never_counted(fleet, redis_url, monkeypatch):
    from server.conftest import AUTH, AUTH_ENV

    for k, v in AUTH_ENV.items():
        monkeypatch.setenv(k, v)
    await fleet.start(redis_url, "xy", auth=AUTH, **LOOPY)
    globex = Agent(fleet["y"].address, token="globex-secret", tenant="globex")
    await globex.connect(process_id="g")
    tid = trace_id_of(3)
    await globex.start_run("g1", tid)
    acme = Agent(fleet["x"].address, token="acme-secret", tenant="acme")  # its token, x
    for i in range(1, 8):  # a loop, under globex's run id, with acme's token
        await acme.export(
            numbered(tool_span("g1", tid, "ef" * 16), 2 * i - 1),
            numbered(step_span("g1", tid, i), 2 * i),
        )
    x = fleet["x"].registry
    await wait_until_async(lambda: x.stats.get("foreign_remote_dropped", 0) >= 1)
    assert "g1" not in x.runs or x.runs["g1"].remote is None
    # a barrier, not a sleep: an operator cancel of g1 through x takes the path a wrong cancel
    # from x's ingest would have taken (x -> bus -> y -> globex), after it; when it arrives,
    # it is the only cancel globex ever got
    cancel = pb.CancelRequest(selector=pb.Selector(run_id="g1"))
    await fleet.admin("x").Cancel(cancel, metadata=globex.metadata)
    await globex.wait_for(lambda m: m.WhichOneof("body") == "cancel")
    assert [d.reason for d in globex.directives("cancel")] == ["operator_cancel"]
    await globex.close()
    await acme.close()


async def test_run_that_failed_over_to_another_replica_gets_no_agent_lost(fleet, redis_url):
    # a grace long enough that the directory shows z holding r1 before it runs out on x, even
    # on a loaded machine (1 s was not, at load 18); x must then drop r1 from its detached
    # runs (checked below), so no grace can run out for it later
    await fleet.start(redis_url, "xz", guard={"agent_grace_s": 5.0})
    first = await _runs_on(fleet, "x", ["r1"])
    x = fleet["x"].registry
    await first.close()  # x's stream drops: r1 is detached on x, within the grace
    await wait_until_async(lambda: x.runs.get("r1") is not None and not x.runs["r1"].connected)
    again = Agent(fleet["z"].address)  # the agent fails over and re-registers on z
    rs = pb.RunStarted(run_id="r1", trace_id=trace_id_of(100 + 10 * ord("x")).hex(), agent="bot")
    rs.tenant = "acme"
    await again.connect(live_runs=[rs], process_id="p-x")
    # x sees z hold it now: no agent_lost from x, ever
    await wait_until_async(lambda: x.runs.get("r1") is None or x.runs["r1"].remote == "z")
    assert "r1" not in x.detached  # so no grace runs out for it on x (sweep's agent_lost)
    await again.end_run("r1")
    await wait_until_async(lambda: fleet.sinks["z"].run("r1") is not None)
    x.sweep()
    assert fleet.sinks["x"].runs == []
    assert [o.run_id for o in fleet.sinks["z"].runs] == ["r1"]
    await again.close()


async def test_cancel_sent_to_a_dead_holder_is_sent_again_to_the_new_one(fleet, redis_url):
    first, spans, tid, _ = await _remote_run(fleet, redis_url, "xyz")
    x = fleet["x"].registry
    # y stops working (as when it is killed): it reads no directive, renews no entry
    y = fleet["y"].registry
    for task in [y.directory._task, *y.bus._tasks]:
        task.cancel()
    for i in range(2, 8):  # x decides the loop and sends the cancel to y's stream: unread
        await spans.export(
            numbered(tool_span("r1", tid, "12" * 16), 2 * i),
            numbered(step_span("r1", tid, i), 2 * i + 1),
        )
    assert x.runs["r1"].stop_reason is not None
    # the agent fails over to z and re-registers r1 there
    again = Agent(fleet["z"].address)
    rs = pb.RunStarted(run_id="r1", trace_id=tid.hex(), agent="bot", tenant="acme")
    await again.connect(live_runs=[rs], process_id="p-y")
    msg = await again.wait_for(
        lambda m: m.WhichOneof("body") == "cancel" and m.cancel.run_id == "r1", timeout=10.0
    )
    assert msg.cancel.reason == "loop_detected"
    await first.close()
    await again.close()
    await spans.close()
