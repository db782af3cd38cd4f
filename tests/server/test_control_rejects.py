"""Errors per message, not per stream, against a real guard on 127.0.0.1:0: after the Hello,
each kind of control message out of its bounds is answered in the stream with a Reject
(its kind, its run and request when it has them, the reason with the numbers, the status
code), changes nothing, and the good messages behind it take effect on the same stream.
What makes the stream itself unusable still ends it."""

from __future__ import annotations

import asyncio
import math

import grpc
import pytest
from _wait import wait_until_async

from guard.bounds import MAX_ID_CHARS, MAX_RUNS_PER_MESSAGE
from guard.server.control import _stream as _control
from guard.server.control._stream import MAX_CONTROL_MESSAGE_BYTES, Oversize
from guard.v1 import guard_pb2 as pb

from .conftest import Agent, trace_id_of

INVALID = grpc.StatusCode.INVALID_ARGUMENT.value[0]
TOO_LARGE = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]


def _rejects(agent: Agent) -> list[pb.Reject]:
    return [m.reject for m in agent.messages if m.WhichOneof("body") == "reject"]


def _started(run_id: str, n: int, request_id: int, **kw) -> pb.AgentMessage:
    fields = {"trace_id": trace_id_of(n).hex(), "tenant": "acme", **kw}
    rs = pb.RunStarted(run_id=run_id, request_id=request_id, **fields)
    return pb.AgentMessage(run_started=rs)


def _admitted(agent: Agent) -> set[str]:
    return {m.admit.run_id for m in agent.messages if m.WhichOneof("body") == "admit"}


async def _one_reject(agent: Agent) -> pb.Reject:
    await wait_until_async(lambda: _rejects(agent), what="the Reject")
    [reject] = _rejects(agent)
    return reject


BAD_STARTS = [
    pytest.param({"trace_id": "zz"}, INVALID, "trace_id", id="trace"),
    pytest.param({"agent": "a" * (MAX_ID_CHARS + 1)}, TOO_LARGE,
                 f"{MAX_ID_CHARS + 1} chars (max {MAX_ID_CHARS})", id="agent"),
    pytest.param({"requested": pb.Limits(max_steps=-5)}, INVALID, "max_steps", id="limits"),
    pytest.param({"usage": pb.Usage(cost_usd=1e300)}, INVALID, "usage.cost_usd", id="usage"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "code", "text"), BAD_STARTS)
async def test_a_bad_run_started_is_rejected_and_the_runs_behind_it_are_admitted(
    guard, fields, code, text
):
    agent = Agent(guard.address)
    await agent.connect()
    bad = _started("bad", 2, 2, **fields)
    for msg in (_started("good1", 1, 1), bad, _started("good2", 3, 3)):
        await agent.outbox.put(msg)
    await wait_until_async(lambda: {"good1", "good2"} <= _admitted(agent), what="the admits")
    reject = await _one_reject(agent)
    assert (reject.run_id, reject.body, reject.request_id, reject.code) == (
        "bad",
        "run_started",
        2,
        code,
    )
    assert text in reject.reason and "\n" not in reject.reason and not reject.dead_lettered
    assert "bad" not in guard.registry.runs and agent.error is None
    assert guard.registry.stats["control_rejected_run_started"] == 1
    await agent.close()


async def test_a_bad_heartbeat_is_rejected_and_the_heartbeats_around_it_apply(guard):
    agent = Agent(guard.address)
    await agent.connect()
    await agent.start_run("r1", trace_id_of(1))
    run = guard.registry.runs["r1"]

    def beat(*progress: pb.RunProgress) -> pb.AgentMessage:
        return pb.AgentMessage(heartbeat=pb.Heartbeat(runs=list(progress)))

    await agent.outbox.put(beat(pb.RunProgress(run_id="r1", paused=True)))
    await wait_until_async(lambda: run.paused, what="paused")
    too_long = pb.RunProgress(run_id="x" * (MAX_ID_CHARS + 1))
    flood = [pb.RunProgress(run_id="r1")] * (MAX_RUNS_PER_MESSAGE + 1)
    await agent.outbox.put(beat(pb.RunProgress(run_id="r1", paused=False), too_long))
    await agent.outbox.put(beat(*flood))
    await agent.outbox.put(beat(pb.RunProgress(run_id="r1", paused=True)))
    await wait_until_async(lambda: len(_rejects(agent)) == 2, what="two Rejects")
    first, second = _rejects(agent)
    assert (first.body, first.code) == ("heartbeat", TOO_LARGE)
    assert f"{MAX_ID_CHARS + 1} chars" in first.reason
    assert f"max {MAX_RUNS_PER_MESSAGE} per message" in second.reason
    # a refused heartbeat changed nothing (r1 was not resumed), the one behind it applied
    await agent.outbox.put(beat(pb.RunProgress(run_id="r1", paused=False)))
    await wait_until_async(lambda: not run.paused, what="resumed by the last heartbeat")
    assert agent.error is None and guard.registry.stats["control_rejected_heartbeat"] == 2
    await agent.close()


@pytest.mark.parametrize(
    ("fields", "text"),
    [({"cost_usd": math.inf}, "cost_usd"), ({"tokens": 10**13}, "tokens"),
     ({"run_id": ""}, "run_id is empty")],
    ids=["cost", "tokens", "no-run"],
)  # fmt: skip
async def test_a_bad_allowance_request_is_rejected_and_the_requests_behind_it_answered(
    guard, fields, text
):
    agent = Agent(guard.address)
    await agent.connect()
    await agent.start_run("r1", trace_id_of(1))

    def ask(request_id: int, **kw) -> pb.AgentMessage:
        req = pb.AllowanceRequest(**{"run_id": "r1", "request_id": request_id, **kw})
        return pb.AgentMessage(allowance_request=req)

    for msg in (ask(11, cost_usd=0.1), ask(12, **fields), ask(13, tokens=5)):
        await agent.outbox.put(msg)

    def answered() -> set[int]:
        return {m.allowance.request_id for m in agent.messages if m.HasField("allowance")}

    await wait_until_async(lambda: {11, 13} <= answered(), what="the allowances")
    reject = await _one_reject(agent)
    assert (reject.body, reject.request_id, reject.code) == ("allowance_request", 12, INVALID)
    assert reject.run_id == fields.get("run_id", "r1") and text in reject.reason
    assert 12 not in answered() and agent.error is None
    await agent.close()


async def test_a_second_hello_and_an_unknown_message_are_rejected(guard):
    agent = Agent(guard.address)
    await agent.connect()
    await agent.outbox.put(pb.AgentMessage(hello=pb.Hello(process_id="again", tenant="acme")))
    # what a newer agent's message kind looks like to this guard: no field it knows
    await agent.outbox.put(pb.AgentMessage())
    await agent.outbox.put(_started("after", 5, 5))
    await wait_until_async(lambda: "after" in _admitted(agent), what="the admit")
    assert [(r.body, r.code) for r in _rejects(agent)] == [
        ("hello", INVALID),
        ("unknown", INVALID),
    ]
    assert "hello sent twice" in _rejects(agent)[0].reason and agent.error is None
    await agent.close()


async def test_one_bad_message_in_a_batch_is_rejected_and_the_rest_of_it_applies(guard):
    agent = Agent(guard.address)
    await agent.connect()
    bad = _started("bad", 2, 2, agent="a" * 300)
    batch = pb.AgentBatch(messages=[_started("b1", 1, 1), bad, _started("b2", 3, 3)])
    await agent.outbox.put(pb.AgentMessage(batch=batch))
    await wait_until_async(lambda: {"b1", "b2"} <= _admitted(agent), what="the admits")
    assert [r.run_id for r in _rejects(agent)] == ["bad"] and agent.error is None
    await agent.close()


async def test_an_oversize_message_is_rejected_unparsed_and_other_streams_go_on(guard, monkeypatch):
    """Over the control stream's limit (the batch limit, not OTLP's larger one): refused
    before protobuf parses it, answered with its size and the limit, and neither this stream
    nor another one ends."""
    parsed: list[int] = []
    real = _control._parse

    def counting(data: bytes) -> pb.AgentMessage:  # the parser, counting what it is handed
        parsed.append(len(data))
        return real(data)

    monkeypatch.setattr(_control, "_parse", counting)
    try:
        a, b = Agent(guard.address), Agent(guard.address)
        await a.connect(process_id="a")
        await b.connect(process_id="b")
        big = _started("x" * (MAX_CONTROL_MESSAGE_BYTES + 10), 1, 1)
        await a.outbox.put(big)
        await a.outbox.put(_started("after", 2, 2))
        await wait_until_async(lambda: "after" in _admitted(a), what="the admit behind it")
        reject = await _one_reject(a)
        assert (reject.body, reject.code) == ("run_started", TOO_LARGE)
        assert f"(max {MAX_CONTROL_MESSAGE_BYTES})" in reject.reason
        assert max(parsed) < MAX_CONTROL_MESSAGE_BYTES  # the big one was never parsed
        await b.start_run("b1", trace_id_of(3))  # the other stream is untouched
        assert a.error is None and b.error is None
        await a.close()
        await b.close()
    finally:
        monkeypatch.undo()


def test_oversize_names_the_message_kind_from_its_first_byte():
    data = pb.AgentMessage(heartbeat=pb.Heartbeat()).SerializeToString() + b"\x00" * 4
    assert Oversize(data).body == "heartbeat"
    assert Oversize(b"\xff\xff").body == "" and Oversize(b"").size == 0
    assert type(_control._deserialize(b"\x1a" + b"\x00" * MAX_CONTROL_MESSAGE_BYTES)) is Oversize


async def test_what_makes_the_stream_unusable_still_ends_it(guard):
    """An oversize first message (no Hello), bytes that do not parse: the stream ends."""
    ch = grpc.aio.insecure_channel(guard.address)
    raw = ch.stream_stream("/guard.v1.GuardControl/Attach")

    async def one(data: bytes) -> grpc.aio.AioRpcError:
        async def gen():
            yield data
            await asyncio.sleep(5)

        call = raw(gen())
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            async for _ in call:
                pass
        return exc.value

    err = await one(b"\x0a" + b"\x00" * (MAX_CONTROL_MESSAGE_BYTES + 1))
    assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and "bytes (max" in err.details()
    err = await one(b"\xff\xff\xff\x0f garbage")
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    await ch.close()
