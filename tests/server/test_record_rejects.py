"""A termination record the guard cannot accept is refused on its own, against a real guard
on 127.0.0.1:0: answered in the stream with a Reject (run id, reason, status code), kept in
the sink's dead letter, and the records around it (alone or in one batch) are stored; the
stream stays up. An agent clock a day ahead or years behind is no reason to refuse: the
record is stored with the guard's receive time and says so."""

from __future__ import annotations

import logging
import math
import time

import grpc
import pytest
from _wait import wait_until_async

from guard.bounds import MAX_ID_CHARS
from guard.server import GuardServer, MemorySink, NullSink
from guard.v1 import guard_pb2 as pb

from .conftest import Agent, config, trace_id_of

DAY_S = 86_400.0
YEAR_S = 365.25 * DAY_S


def _ended(run_id: str, **kw) -> pb.AgentMessage:
    fields = {"status": "completed", "reason": "final_answer", "tenant": "acme", **kw}
    return pb.AgentMessage(run_ended=pb.RunEnded(outcome=pb.Outcome(run_id=run_id, **fields)))


def _rejects(agent: Agent) -> list[pb.Reject]:
    return [m.reject for m in agent.messages if m.WhichOneof("body") == "reject"]


def _acked(agent: Agent) -> set[str]:
    return {m.record_ack.run_id for m in agent.messages if m.WhichOneof("body") == "record_ack"}


POISONS = [
    pytest.param({"status": "exploded"}, grpc.StatusCode.INVALID_ARGUMENT, "outcome.status",
                 id="status"),
    pytest.param({"usage": pb.Usage(cost_usd=1e300)}, grpc.StatusCode.INVALID_ARGUMENT,
                 "usage.cost_usd", id="cost"),
    pytest.param({"usage": pb.Usage(input_tokens=2**63)}, grpc.StatusCode.INVALID_ARGUMENT,
                 "usage.input_tokens", id="tokens"),
    pytest.param({"message": "m" * 100_000}, grpc.StatusCode.RESOURCE_EXHAUSTED,
                 "outcome.message", id="message"),
]  # fmt: skip


@pytest.mark.parametrize("batched", [False, True], ids=["alone", "batch"])
@pytest.mark.parametrize(("poison", "code", "text"), POISONS)
async def test_a_poison_run_ended_is_rejected_and_the_stream_goes_on(
    guard, sink, batched, poison, code, text
):
    agent = Agent(guard.address)
    await agent.connect()
    for i, rid in enumerate(("good1", "bad", "good2")):
        await agent.start_run(rid, trace_id_of(i + 1))
    msgs = [_ended("good1"), _ended("bad", **poison), _ended("good2")]
    if batched:
        await agent.outbox.put(pb.AgentMessage(batch=pb.AgentBatch(messages=msgs)))
    else:
        for m in msgs:
            await agent.outbox.put(m)
    await wait_until_async(lambda: {"good1", "good2"} <= _acked(agent))
    [reject] = _rejects(agent)
    assert (reject.run_id, reject.body, reject.code) == ("bad", "run_ended", code.value[0])
    assert text in reject.reason and "\n" not in reject.reason and reject.dead_lettered
    assert "bad" not in _acked(agent)
    # the good records are stored; the refused one is dead-lettered, never dropped, and the
    # guard ends its run itself (its slot is given back now, not at agent_lost)
    agent_records = {o.run_id for o in sink.runs if o.decided_by.value == "sdk"}
    assert agent_records == {"good1", "good2"}
    [(table, rid, error, raw)] = sink.dead_letters
    assert (table, rid) == ("runs", "bad") and text in error and 'run_id: "bad"' in raw
    mine = sink.run("bad")
    assert (mine.decided_by.value, mine.reason.value, mine.status.value) == (
        "guard",
        "error",
        "failed",
    )
    assert "refused" in mine.message and "bad" not in guard.registry.runs
    assert guard.registry.stats["records_rejected"] == 1
    # the stream is still up: a new run is admitted on it, its record acknowledged
    assert (await agent.start_run("after", trace_id_of(9))).WhichOneof("body") == "admit"
    await agent.outbox.put(_ended("after"))
    await wait_until_async(lambda: "after" in _acked(agent))
    assert agent.error is None
    await agent.close()


async def test_a_rejected_record_with_an_oversized_run_id_names_it_within_bounds(guard, sink):
    agent = Agent(guard.address)
    await agent.connect()
    await agent.outbox.put(_ended("r" * 100_000))
    await agent.outbox.put(_ended("ok"))
    await wait_until_async(lambda: "ok" in _acked(agent))
    [reject] = _rejects(agent)
    assert (
        reject.run_id == "r" * MAX_ID_CHARS
        and reject.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    )
    assert len(sink.dead_letters) == 1
    await agent.close()


async def test_without_a_dead_letter_a_refusal_is_one_warning_and_counted(caplog):
    caplog.set_level(logging.WARNING, logger="guard.server")
    async with GuardServer(config(), listen="127.0.0.1:0", sink=NullSink()) as srv:
        agent = Agent(srv.address)
        await agent.connect()
        await agent.outbox.put(_ended("bad", reason="nonsense"))
        await agent.outbox.put(_ended("ok"))
        await wait_until_async(lambda: "ok" in _acked(agent))
        [reject] = _rejects(agent)
        assert reject.run_id == "bad" and not reject.dead_lettered
        lines = [
            r for r in caplog.records if r.name == "guard.server" and "'bad'" in r.getMessage()
        ]
        assert len(lines) == 1 and lines[0].levelno == logging.WARNING
        assert "outcome.reason" in lines[0].getMessage()
        assert srv.figures()["records_rejected"] == 1.0
        await agent.close()


SKEWS = [
    pytest.param(lambda now: (now + 25 * 3600 - 5, now + 25 * 3600), id="plus-25h"),
    pytest.param(lambda now: (now - 10 * YEAR_S - 5, now - 10 * YEAR_S), id="minus-10y"),
    pytest.param(lambda now: (now - 5, 1e15), id="end-1e15"),
    pytest.param(lambda now: (math.nan, now), id="start-nan"),
]


@pytest.mark.parametrize("skew", SKEWS)
async def test_a_skewed_agent_clock_is_stored_with_the_receive_time_never_dropped(skew):
    sink = MemorySink()
    async with GuardServer(config(), listen="127.0.0.1:0", sink=sink) as srv:
        agent = Agent(srv.address)
        await agent.connect()
        now = time.time()
        started, ended = skew(now)
        ids = [f"s{i}" for i in range(5)]
        for i, rid in enumerate(ids):
            await agent.start_run(rid, trace_id_of(i + 1))
        before = time.time()
        for rid in ids:  # one stream, every run of the skewed process
            kw = {"started_at_unix": started, "ended_at_unix": ended, "elapsed_ms": 5000}
            await agent.outbox.put(_ended(rid, message="done", **kw))
        await wait_until_async(lambda: set(ids) <= _acked(agent))
        after = time.time()
        assert not _rejects(agent) and not sink.dead_letters and agent.error is None
        assert {o.run_id for o in sink.runs} == set(ids)
        for o in sink.runs:
            assert o.decided_by.value == "sdk"  # the agent's own record, not a guard-side end
            assert before - 1 <= o.ended_at <= after + 1
            assert o.started_at <= o.ended_at and o.ended_at - o.started_at <= 6.0
            assert o.message.startswith("done [guard: agent clock out of bounds;")
            assert "receive time" in o.message
        assert srv.registry.stats["records_clamped"] == len(ids)
        await agent.close()


async def test_a_correct_clock_is_left_alone(guard, sink):
    agent = Agent(guard.address)
    await agent.connect()
    now = time.time()
    await agent.outbox.put(_ended("fine", message="ok", started_at_unix=now - 3, ended_at_unix=now))
    await wait_until_async(lambda: "fine" in _acked(agent))
    o = sink.run("fine")
    assert (o.started_at, o.ended_at, o.message) == (now - 3, now, "ok")
    assert guard.registry.stats["records_clamped"] == 0
    await agent.close()
