"""Exactly-once termination records, guard side: RecordAck once durable, a repeat is the same
run, and a restarted guard rebuilds live runs from the agents' re-registrations without
counting a span twice, stopping a run early, or writing a span-derived or anonymous record.

The "restarted guard" here is a fresh GuardServer that receives what a restarted one gets:
the exporter's retried spans (numbered with ``guard.seq``) around the agent's Hello.
"""

from __future__ import annotations

from _wait import wait_until_async

from guard.server import GuardServer
from guard.v1 import guard_pb2 as pb

from .conftest import Agent, config, model_span, span, step_span, trace_id_of


def _acks(agent: Agent, run_id: str) -> int:
    return sum(
        1
        for m in agent.messages
        if m.WhichOneof("body") == "record_ack" and m.record_ack.run_id == run_id
    )


async def test_run_ended_is_acknowledged_and_a_repeat_changes_nothing(sink, guard):
    agent = Agent(guard.address)
    await agent.connect()
    await agent.start_run("r1", trace_id_of(1))
    await agent.end_run("r1", status="terminated", reason="max_steps", agent="bot")
    await agent.wait_for(lambda m: m.WhichOneof("body") == "record_ack")
    assert [o.run_id for o in sink.runs] == ["r1"]  # written before the ack
    await agent.end_run("r1", status="terminated", reason="max_steps", agent="bot")  # resend
    await wait_until_async(lambda: _acks(agent, "r1") == 2)
    assert [o.run_id for o in sink.runs] == ["r1"]
    # a record for a run this guard never saw (it ended while the guard was away) is written
    await agent.end_run("gone", status="completed", reason="final_answer", agent="bot")
    await wait_until_async(lambda: _acks(agent, "gone") == 1)
    assert sorted(o.run_id for o in sink.runs) == ["gone", "r1"]
    assert not [m for m in agent.messages if m.WhichOneof("body") == "ack"]  # never acked back
    await agent.close()


def _numbered(run_id: str, tid: bytes, seqs: range) -> list:
    """SDK-shaped spans: odd seq = a step span (with tenant), even = a model call."""
    out = []
    for seq in seqs:
        if seq % 2:
            out.append(step_span(run_id, tid, seq // 2 + 1, **{"guard.tenant": "acme"}))
        else:
            out.append(model_span(run_id, tid))
        out[-1].attributes.add(key="guard.seq").value.int_value = seq
    return out


def _run_span(run_id: str, tid: bytes, reason: str = "max_steps") -> object:
    attrs = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "bot",
        "guard.run.id": run_id,
        "guard.tenant": "acme",
        "guard.stop.status": "terminated",
        "guard.stop.reason": reason,
    }
    return span("invoke_agent bot", tid, attrs)


def _live(run_id: str, tid: bytes, steps: int, seq: int, **kw) -> pb.RunStarted:
    return pb.RunStarted(
        run_id=run_id,
        trace_id=tid.hex(),
        tenant="acme",
        agent="bot",
        requested=pb.Limits(max_steps=kw.pop("max_steps", 30)),
        usage=pb.Usage(
            steps=steps, model_calls=kw.pop("model_calls", steps), input_tokens=100 * steps
        ),
        span_seq=seq,
        **kw,
    )


async def test_spans_ahead_of_the_re_registration_are_counted_once(sink, guard):
    tid = trace_id_of(2)
    agent = Agent(guard.address)
    # The exporter's retries reach the restarted guard first: seq 1..10 (5 steps, 5 calls).
    await agent.export(*_numbered("r2", tid, range(1, 11)))
    run = guard.registry.runs["r2"]
    assert run.budget.usage().steps == 0  # uncounted: it waits for its agent
    assert run.provisional
    # The agent's snapshot holds seq <= 8 (4 steps, 4 calls); 9 and 10 were recorded after.
    await agent.connect(live_runs=[_live("r2", tid, steps=4, seq=8)])
    await agent.wait_for(lambda m: m.WhichOneof("body") == "admit")
    run = guard.registry.runs["r2"]
    assert (run.tenant, run.agent, run.connected) == ("acme", "bot", True)
    u = run.budget.usage()
    assert (u.steps, u.model_calls) == (5, 5)  # 4 restored + the two spans above the floor
    await agent.export(*_numbered("r2", tid, range(1, 11)))  # retried again: nothing new
    await agent.export(*_numbered("r2", tid, range(11, 13)))  # new work counts
    u = run.budget.usage()
    assert (u.steps, u.model_calls) == (6, 6)
    assert guard.registry.stats["replayed_spans"] >= 10
    # 30 steps in the agent mean 30 here, not more: no early stop, no cancel
    await agent.export(*_numbered("r2", tid, range(13, 61)))
    assert run.budget.usage().steps == 30 and run.stop_reason is None
    assert not agent.directives("cancel")
    assert sink.runs == []
    await agent.close()


async def test_restored_nested_runs_are_set_not_added(sink, guard):
    agent = Agent(guard.address)
    parent = _live("p", trace_id_of(3), steps=10, seq=20)  # its usage holds the child's 4
    child = _live("c", trace_id_of(3), steps=4, seq=8, parent_run_id="p")
    await agent.connect(live_runs=[parent, child])
    await wait_until_async(lambda: "c" in guard.registry.runs)
    assert guard.registry.runs["p"].budget.usage().steps == 10
    assert guard.registry.runs["c"].budget.usage().steps == 4
    await agent.close()


async def test_run_span_ahead_of_its_agent_writes_no_record(sink, guard):
    tid = trace_id_of(4)
    agent = Agent(guard.address)
    await agent.export(*_numbered("r4", tid, range(1, 7)), _run_span("r4", tid))
    assert "r4" in guard.registry.runs and sink.runs == []  # no span-derived record
    # The agent comes back: the run ended in it, and its record is resent after the Hello.
    await agent.connect()
    await agent.end_run("r4", status="terminated", reason="max_steps", agent="bot")
    await agent.wait_for(lambda m: m.WhichOneof("body") == "record_ack")
    assert [(o.run_id, o.tenant, o.agent) for o in sink.runs] == [("r4", "acme", "bot")]
    await agent.export(*_numbered("r4", tid, range(1, 7)))  # late retries: nothing new
    assert "r4" not in guard.registry.runs and len(sink.runs) == 1
    await agent.close()


async def test_hello_ended_runs_drop_the_exporters_retries(sink, guard):
    tid = trace_id_of(5)
    agent = Agent(guard.address)
    # r5's record was acknowledged by the guard before its restart; its spans come again
    await agent.export(*_numbered("r5", tid, range(1, 5)), _run_span("r5", tid))
    await agent.connect(ended_runs=["r5"])
    await wait_until_async(lambda: "r5" not in guard.registry.runs)
    await agent.export(*_numbered("r5", tid, range(1, 5)), _run_span("r5", tid))
    assert "r5" not in guard.registry.runs
    assert sink.runs == []  # its one record is the one the earlier guard holds
    await agent.close()


async def test_a_run_whose_agent_never_returns_is_recorded_once_with_its_identity(sink):
    cfg = config(guard={"agent_grace_s": 0.2})
    async with GuardServer(cfg, listen="127.0.0.1:0", sink=sink) as srv:
        tid = trace_id_of(6)
        agent = Agent(srv.address)
        await agent.export(*_numbered("r6", tid, range(2, 5)))  # a model span came first
        await agent.export(_run_span("r6", tid, reason="loop_detected"))
        await agent.export(*_numbered("r7", trace_id_of(7), range(1, 4)))
        await wait_until_async(lambda: len(sink.runs) == 2)
        by_id = {o.run_id: o for o in sink.runs}
        r6, r7 = by_id["r6"], by_id["r7"]
        assert (r6.tenant, r6.agent, r6.reason.value, r6.decided_by.value) == (
            "acme",
            "bot",
            "loop_detected",
            "sdk",
        )
        assert (r7.tenant, r7.reason.value) == ("acme", "agent_lost")  # no run span: lost
        await agent.close()


async def test_operator_cancel_of_a_provisional_run_reaches_its_agent(sink, guard):
    from guard.cli._client import AdminClient

    tid = trace_id_of(8)
    agent = Agent(guard.address)
    await agent.export(*_numbered("r8", tid, range(1, 4)))
    with AdminClient(guard.address) as c:
        await guard_call(c.cancel, tenant="acme")
    assert sink.runs == []  # not ended behind its agent's back
    await agent.connect(live_runs=[_live("r8", tid, steps=2, seq=3)])
    d = await agent.wait_for(lambda m: m.WhichOneof("body") == "cancel")
    assert (d.cancel.run_id, d.cancel.reason) == ("r8", "operator_cancel")
    await agent.close()


async def guard_call(fn, *args, **kw):
    import asyncio

    return await asyncio.to_thread(fn, *args, **kw)


async def test_provisional_spans_are_bounded_in_total(sink, guard, monkeypatch):
    from guard.server.runs import _table

    monkeypatch.setattr(_table, "PROVISIONAL_SPANS_TOTAL", 3)
    reg = guard.registry
    agent = Agent(guard.address)
    await agent.export(*_numbered("m1", trace_id_of(9), range(1, 5)))
    await agent.export(*_numbered("m2", trace_id_of(10), range(1, 5)))
    assert reg.provisional_spans == 3 and reg.stats["provisional_spans_dropped"] == 5
    await agent.connect(ended_runs=["m1", "m2"])  # dropping them releases what they held
    await wait_until_async(lambda: reg.provisional_spans == 0)
    assert not {"m1", "m2"} & set(reg.runs)
    await agent.close()
