"""Control-stream batches on a real grpc.aio guard: AgentBatch in, GuardBatch out, old agents
unchanged, a bad batch refused whole."""

from __future__ import annotations

import grpc
from _wait import wait_until_async

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
        await wait_until_async(lambda: agent.error is not None, what="the stream ends")
        assert agent.error.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "batch may not hold hello" in agent.error.details()
        assert "bad1" not in srv.registry.runs
        assert not [m for m in agent.messages if m.WhichOneof("body") == "admit"]
        await agent.close()


async def test_an_oversized_batch_is_refused(sink):
    async with GuardServer(config(), listen="127.0.0.1:0", sink=sink) as srv:
        agent = BatchAgent(srv.address)
        await agent.connect()
        acks = [pb.AgentMessage(ack=pb.Ack(command_id=1))] * (MAX_BATCH_MESSAGES + 1)
        await agent.send_batch(_started("big1", 31, 1), *acks)
        await wait_until_async(lambda: agent.error is not None, what="the stream ends")
        assert agent.error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"{MAX_BATCH_MESSAGES + 2} messages (max {MAX_BATCH_MESSAGES})" in (
            agent.error.details()
        )
        assert "big1" not in srv.registry.runs
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
