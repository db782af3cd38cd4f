"""Several replicas behave as one guard: runs whose spans reach one replica and whose control
stream another holds, fleet-wide Cancel and ListRuns, the run directory's heartbeat TTL.

Real parts: a real redis-server, real ``GuardServer`` replicas (grpc on 127.0.0.1:0) and
hand-rolled agents speaking the real protocol (control stream and OTLP export)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from server.conftest import Agent, eventually, step_span, tool_span, trace_id_of

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
        if await eventually(lambda: bool(agent.directives("cancel", "r1")), timeout=0.3):
            break
    msg = await agent.wait_for(lambda m: m.WhichOneof("body") == "cancel")
    assert msg.cancel.reason == "loop_detected"
    # x decided, y pushed it and wrote the one decision record (with the delivery latency)
    assert await eventually(lambda: any(d.action == "cancel" for d in fleet.sinks["y"].decisions))
    rec = next(d for d in fleet.sinks["y"].decisions if d.action == "cancel")
    assert rec.reason == "loop_detected" and rec.delivery_latency_ms is not None
    assert rec.guard_id == "y"
    assert not [d for d in fleet.sinks["x"].decisions if d.action == "cancel"]
    await agent.end_run("r1", status="terminated", reason="loop_detected", decided_by="guard")
    assert await eventually(lambda: fleet.sinks["y"].run("r1") is not None)
    # x learns from the directory that it ended, and forgets it without a record of its own
    assert await eventually(lambda: "r1" not in x.registry.runs, timeout=5.0)
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


async def test_fleet_cancel_through_a_third_replica_and_deny_during_it(fleet, redis_url):
    await fleet.start(redis_url, "xyz")
    ax = await _runs_on(fleet, "x", ["x1", "x2"])
    ay = await _runs_on(fleet, "y", ["y1"])
    other = await _runs_on(fleet, "y", ["g1"], tenant="globex")
    await asyncio.sleep(0)  # the replicas' directory heartbeats ran at start
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
    await ax.close()
    await ay.close()


async def test_remote_run_is_listed_once_by_its_stream_replica(fleet, redis_url):
    await fleet.start(redis_url, "xy", **LOOPY)
    agent = await _runs_on(fleet, "y", ["r1"])
    spans = Agent(fleet["x"].address)
    tid = trace_id_of(100 + 10 * ord("y"))
    await spans.export(numbered(step_span("r1", tid, 1), 1))
    run = fleet["x"].registry.runs.get
    assert await eventually(lambda: run("r1") is not None and run("r1").remote == "y")
    resp = await fleet.admin("x").ListRuns(pb.ListRunsRequest())
    assert [(r.run_id, r.guard_id) for r in resp.runs] == [("r1", "y")]
    await agent.close()
    await spans.close()


async def test_directory_entries_lapse_when_heartbeats_stop(fleet, redis_url, redis_server):
    await fleet.start(redis_url, "xy")
    ax = await _runs_on(fleet, "x", ["x1"])
    state = fleet["y"].registry.state
    key = fleet["x"].registry.directory.key("x1")
    assert await eventually(lambda: True)
    got = await state.pipeline([("HGET", key, "r")])
    for _ in range(100):
        if got == ["x"]:
            break
        await asyncio.sleep(0.02)
        got = await state.pipeline([("HGET", key, "r")])
    assert got == ["x"]
    assert "x" in await fleet["y"].registry.directory.replicas()
    # x's heartbeats stop (as when its process is killed): its entries lapse within seconds
    task = fleet["x"].registry.directory._task
    task.cancel()
    deadline = asyncio.get_running_loop().time() + 10.0
    while (await state.pipeline([("EXISTS", key)])) != [0]:
        assert asyncio.get_running_loop().time() < deadline, "entry did not lapse"
        await asyncio.sleep(0.1)
    while "x" in await fleet["y"].registry.directory.replicas():
        assert asyncio.get_running_loop().time() < deadline, "replica did not lapse"
        await asyncio.sleep(0.1)
    await ax.close()


async def test_ended_run_leaves_a_tombstone(fleet, redis_url):
    await fleet.start(redis_url, "xy")
    ax = await _runs_on(fleet, "x", ["x1"])
    await ax.end_run("x1")
    assert await eventually(lambda: fleet.sinks["x"].run("x1") is not None)
    directory = fleet["y"].registry.directory
    deadline = asyncio.get_running_loop().time() + 5.0
    while True:
        entry = (await directory.lookup(["x1"])).get("x1")
        if entry is not None and entry.ended:
            break
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.02)
    assert entry.replica == "x" and entry.tenant == "acme"
    await ax.close()
