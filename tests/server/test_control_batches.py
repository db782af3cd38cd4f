"""Control-stream batches on a real grpc.aio guard: AgentBatch in, GuardBatch out, old agents
unchanged, a bad batch refused whole."""

from __future__ import annotations

import grpc
from _hyp import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from guard.server import GuardServer
from guard.v1 import guard_pb2 as pb
from guard.wire import MAX_BATCH_MESSAGES

from .conftest import Agent, config, trace_id_of


class BatchAgent(Agent):
    """An agent whose Hello says it reads GuardBatch; keeps every frame as it came
    (``frames``) and, in ``messages``, the messages with each batch opened."""

    def __init__(self, address: str, *, batches: bool = True) -> None:
        super().__init__(address)
        self.batches = batches
        self.frames: list[pb.GuardMessage] = []

    async def connect(self) -> pb.Welcome:
        self.call = self.stub.Attach(self._requests(), metadata=self.metadata)
        hello = pb.Hello(process_id="p1", tenant=self.tenant, accepts_batches=self.batches)
        await self.outbox.put(pb.AgentMessage(hello=hello))
        import asyncio

        self.task = asyncio.ensure_future(self._read())
        return (await self.wait_for(lambda m: m.WhichOneof("body") == "welcome")).welcome

    async def _read(self) -> None:
        try:
            async for frame in self.call:
                self.frames.append(frame)
                inner = frame.batch.messages if frame.WhichOneof("body") == "batch" else [frame]
                self.messages.extend(inner)
                self.new.set()
        except grpc.RpcError as exc:
            self.error = exc
            self.new.set()

    def batch_frames(self) -> list[pb.GuardBatch]:
        return [f.batch for f in self.frames if f.WhichOneof("body") == "batch"]

    async def send_batch(self, *messages: pb.AgentMessage) -> None:
        await self.outbox.put(pb.AgentMessage(batch=pb.AgentBatch(messages=list(messages))))


def _started(run_id: str, n: int, request_id: int) -> pb.AgentMessage:
    rs = pb.RunStarted(
        run_id=run_id, trace_id=trace_id_of(n).hex(), tenant="acme", request_id=request_id
    )
    return pb.AgentMessage(run_started=rs)


def _ended(run_id: str) -> pb.AgentMessage:
    outcome = pb.Outcome(run_id=run_id, status="completed", reason="final_answer", tenant="acme")
    return pb.AgentMessage(run_ended=pb.RunEnded(outcome=outcome))


def _kinds(batch: pb.GuardBatch) -> list[str]:
    return [m.WhichOneof("body") for m in batch.messages]


async def test_a_batch_of_runs_is_admitted_and_ended_in_guard_batches(sink):
    async with GuardServer(config(), listen="127.0.0.1:0", sink=sink) as srv:
        agent = BatchAgent(srv.address)
        welcome = await agent.connect()
        assert welcome.accepts_batches
        ids = [f"b{i}" for i in range(4)]
        await agent.send_batch(*(_started(r, 10 + i, i + 1) for i, r in enumerate(ids)))
        for i in range(4):
            await agent.wait_for(lambda m, i=i: m.WhichOneof("body") == "admit"
                                 and m.admit.request_id == i + 1)  # fmt: skip
        assert all(srv.registry.runs[r].connected for r in ids)
        # the guard applied the whole batch before its writer ran: one GuardBatch of 4 Admits
        assert any(_kinds(b).count("admit") == 4 for b in agent.batch_frames())
        await agent.send_batch(*(_ended(r) for r in ids))
        for r in ids:
            await agent.wait_for(lambda m, r=r: m.WhichOneof("body") == "record_ack"
                                 and m.record_ack.run_id == r)  # fmt: skip
        assert all(sink.run(r) is not None for r in ids) and not set(ids) & set(srv.registry.runs)
        assert any(_kinds(b).count("record_ack") == 4 for b in agent.batch_frames())
        await agent.close()


async def test_an_agent_that_did_not_ask_gets_one_message_per_write(sink):
    async with GuardServer(config(), listen="127.0.0.1:0", sink=sink) as srv:
        agent = BatchAgent(srv.address, batches=False)
        await agent.connect()
        for i in range(4):
            await agent.outbox.put(_started(f"o{i}", 20 + i, i + 1))
        for i in range(4):
            await agent.wait_for(lambda m, i=i: m.WhichOneof("body") == "admit"
                                 and m.admit.request_id == i + 1)  # fmt: skip
        assert len(agent.frames) >= 5 and not agent.batch_frames()
        await agent.close()


async def test_a_bad_batch_is_refused_before_any_of_it_applies(sink):
    async with GuardServer(config(), listen="127.0.0.1:0", sink=sink) as srv:
        agent = BatchAgent(srv.address)
        await agent.connect()
        hello = pb.AgentMessage(hello=pb.Hello(process_id="p2", tenant="acme"))
        await agent.send_batch(_started("bad1", 30, 1), hello)
        # refused whole, in the stream: the stream goes on
        reject = (await agent.wait_for(lambda m: m.WhichOneof("body") == "reject")).reject
        assert reject.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert reject.body == "batch" and "batch may not hold hello" in reject.reason
        assert "bad1" not in srv.registry.runs
        assert not [m for m in agent.messages if m.WhichOneof("body") == "admit"]
        await agent.outbox.put(_started("good1", 32, 2))
        await agent.wait_for(lambda m: m.WhichOneof("body") == "admit")
        assert agent.error is None
        await agent.close()


async def test_an_oversized_batch_is_refused(sink):
    async with GuardServer(config(), listen="127.0.0.1:0", sink=sink) as srv:
        agent = BatchAgent(srv.address)
        await agent.connect()
        acks = [pb.AgentMessage(ack=pb.Ack(command_id=1))] * (MAX_BATCH_MESSAGES + 1)
        await agent.send_batch(_started("big1", 31, 1), *acks)
        reject = (await agent.wait_for(lambda m: m.WhichOneof("body") == "reject")).reject
        assert reject.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        assert f"{MAX_BATCH_MESSAGES + 2} messages (max {MAX_BATCH_MESSAGES})" in reject.reason
        assert "big1" not in srv.registry.runs and agent.error is None
        await agent.close()


def test_a_batch_is_bounded_by_count_and_by_size():
    import asyncio

    from guard.wire import MAX_BATCH_BYTES, take_batch

    def end(item) -> bool:
        return item is None

    q: asyncio.Queue = asyncio.Queue()
    for i in range(MAX_BATCH_MESSAGES + 5):
        q.put_nowait(pb.AgentMessage(ack=pb.Ack(command_id=i + 1)))
    q.put_nowait(None)
    batch, carry = take_batch(q, q.get_nowait(), end)
    assert len(batch) == MAX_BATCH_MESSAGES and carry is None
    rest, carry = take_batch(q, q.get_nowait(), end)
    assert [m.ack.command_id for m in rest[:-1]] == list(range(1025, 1030)) and rest[-1] is None

    # a backed-up stream of large heartbeats: never one message over MAX_BATCH_BYTES
    runs = [pb.RunProgress(run_id=f"{i:0200d}") for i in range(7000)]  # ~1.4 MB each
    beats = [pb.AgentMessage(heartbeat=pb.Heartbeat(runs=runs)) for _ in range(3)]
    assert 2 * beats[0].ByteSize() <= MAX_BATCH_BYTES < 3 * beats[0].ByteSize()
    for b in beats[1:]:
        q.put_nowait(b)
    batch, carry = take_batch(q, beats[0], end)
    assert batch == beats[:2] and carry is beats[2] and q.empty()
    assert take_batch(q, carry, end) == ([beats[2]], None)


def _commands(sizes: list[int]) -> list[pb.GuardMessage]:
    """Commands of the kinds a run gets (Admit, Allowance, RecordAck), of varied sizes."""
    out = []
    for i, n in enumerate(sizes):
        m = pb.GuardMessage(command_id=i + 1, sent_at_unix=1.7e9 + i)
        if i % 3 == 0:
            m.admit.run_id = "r" * n
            m.admit.effective.max_steps = n
        elif i % 3 == 1:
            m.allowance.run_id, m.allowance.detail, m.allowance.ttl_s = "a", "d" * n, 30.0
        else:
            m.record_ack.run_id = "x" * n
        out.append(m)
    return out


def _both_ways(msgs: list[pb.GuardMessage], close: bool) -> None:
    """take_encoded on an Outbox writes what take_batch (on an asyncio.Queue) batches."""
    import asyncio

    from guard.server.control._fanout import _CLOSE, AgentSession, Outbox
    from guard.wire import guard_batch_to_pb, take_batch, take_encoded

    end = AgentSession.is_close
    ref: asyncio.Queue = asyncio.Queue()
    fast = Outbox()
    for m in [*msgs[1:], *([_CLOSE] if close else [])]:
        ref.put_nowait(m)
        fast.put_nowait(m)
    first = msgs[0]
    while True:
        batch, carry = take_batch(ref, first, end)
        closing = end(batch[-1])
        items = batch[:-1] if closing else batch
        payload, carry_fast, closing_fast = take_encoded(fast, first, end)
        if not items:
            want = None
        elif len(items) == 1:
            want = items[0].SerializeToString()
        else:
            want = guard_batch_to_pb(items).SerializeToString()
        assert payload == want
        assert carry_fast is carry and closing_fast == closing
        assert list(fast._items) == list(ref._queue)
        if closing or (carry is None and ref.empty()):
            return
        first = carry if carry is not None else ref.get_nowait()
        if carry is None:
            fast.get_nowait()


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=40), st.booleans())
def test_take_encoded_writes_exactly_the_batches_take_batch_builds(sizes, close):
    """The guard's writer serializes each command once and frames the batch as bytes: the
    same messages per write as take_batch, the same bytes as the batch message, the same
    carry and end."""
    _both_ways(_commands(sizes), close)


def test_take_encoded_keeps_the_count_and_size_bounds():
    from guard.wire import MAX_BATCH_BYTES

    _both_ways(_commands([1] * (MAX_BATCH_MESSAGES + 7)), True)
    big = _commands([MAX_BATCH_BYTES // 3 + 10] * 3 + [4] * 5)  # ~1.4 MB each, then small ones
    assert 2 * big[1].ByteSize() <= MAX_BATCH_BYTES < 3 * big[1].ByteSize()
    _both_ways(big[1:], False)
    _both_ways([big[-1], *big], True)
    huge = _commands([MAX_BATCH_BYTES // 2 + 10] * 3)  # each alone, one carried at a time
    _both_ways(huge, True)


def _of_size(n: int) -> pb.GuardMessage:
    """A RecordAck command whose serialized size is exactly ``n`` bytes."""
    m = pb.GuardMessage(command_id=1)
    m.record_ack.run_id = "x" * n
    m.record_ack.run_id = "x" * (2 * n - m.ByteSize())
    while m.ByteSize() > n:  # the length prefixes shrank with the id
        m.record_ack.run_id = m.record_ack.run_id[:-1]
    while m.ByteSize() < n:
        m.record_ack.run_id += "x"
    assert m.ByteSize() == n
    return m


def test_encode_batch_is_the_serialized_batch_message():
    from guard.wire import encode_batch

    # every length prefix width: parts and whole batch at 127/128 and 16383/16384 bytes
    sizes = (10, 127, 128, 129, 16383, 16384, 2_100_000)
    msgs = [_of_size(n) for n in sizes]
    for part in msgs:
        raw = encode_batch([part.SerializeToString()])
        assert raw == pb.GuardMessage(batch=pb.GuardBatch(messages=[part])).SerializeToString()
    msgs += _commands([0, 1, 127, 128, 300, 20000])
    raw = encode_batch([m.SerializeToString() for m in msgs])
    assert raw == pb.GuardMessage(batch=pb.GuardBatch(messages=msgs)).SerializeToString()
    assert list(pb.GuardMessage.FromString(raw).batch.messages) == msgs
