"""The control streams of the fleet load, and the driver that replays it (``_fleet``).

One Attach stream per tenant (one agent process each), speaking the protocol as the SDK
(``guard.sdk._control``) does: Hello first (``accepts_batches``); RunStarted per run, answered
by Allowance and Admit (not acked); whatever is ready at once written as one AgentBatch when
the Welcome says the guard reads them. ``old_agents=True``: as the SDK before batches did (no
``accepts_batches``, every Admit acked, one message per write). A Heartbeat with the live runs every
:data:`HEARTBEAT_EVERY` of the tenant's requests (with the guard at ~40k spans per CPU-second
that is about the SDK's 1 s interval; fixed per request so that the span phase and the
control-only phase carry exactly the same control traffic); RunEnded per run, waited on
until its RecordAck.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
from _fleet import TENANTS, FleetLoad, auth_metadata, run_id, trace_of

__all__ = ["HEARTBEAT_EVERY", "close_streams", "drive_fleet", "open_streams"]

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
HEARTBEAT_EVERY = 8


class _Stream:
    """One tenant's agent process: its Attach stream and the runs it registered."""

    def __init__(self, tenant: int, pb: Any, stub: Any, old: bool = False) -> None:
        self.pb = pb
        self.tenant = tenant
        self.old = old
        self.batches = False  # the guard's Welcome said it reads AgentMessage.batch
        self.queue: asyncio.Queue = asyncio.Queue()
        self.admits: dict[int, asyncio.Future] = {}  # request id -> admitted
        self.acks: dict[str, asyncio.Future] = {}  # run id -> record acknowledged
        self.live: dict[str, int] = {}  # run id -> steps so far
        self.frames_in = 0  # grpc messages read (a batch is one)
        self.frames_out = 0  # grpc messages written
        self.call = stub.Attach(self._requests(), metadata=auth_metadata(tenant))
        self.reader = asyncio.ensure_future(self._read())

    def put(self, msg: Any) -> None:
        self.queue.put_nowait(msg)

    async def _requests(self):
        q = self.queue
        while True:
            batch = [await q.get()]
            while batch[-1] is not None and not q.empty() and len(batch) < 1024:
                batch.append(q.get_nowait())
            closing = batch[-1] is None
            if closing:
                batch.pop()
            if len(batch) > 1 and self.batches:
                self.frames_out += 1
                yield self.pb.AgentMessage(batch=self.pb.AgentBatch(messages=batch))
            else:
                for item in batch:
                    self.frames_out += 1
                    yield item
            if closing:
                return

    @staticmethod
    def _settle(box: dict, key: Any, error: str | None = None) -> None:
        fut = box.pop(key, None)
        if fut is not None and not fut.done():
            if error is None:
                fut.set_result(True)
            else:
                fut.set_exception(RuntimeError(error))

    async def _read(self) -> None:
        async for msg in self.call:
            self.frames_in += 1
            if msg.WhichOneof("body") == "batch":
                for inner in msg.batch.messages:
                    self._handle(inner)
            else:
                self._handle(msg)

    def _handle(self, msg: Any) -> None:
        pb = self.pb
        kind = msg.WhichOneof("body")
        if kind == "welcome":
            self.batches = msg.welcome.accepts_batches and not self.old
        elif kind == "admit":
            if self.old:
                ack = pb.Ack(command_id=msg.command_id, run_id=msg.admit.run_id, applied=True)
                self.put(pb.AgentMessage(ack=ack))
            self._settle(self.admits, msg.admit.request_id)
        elif kind == "record_ack":
            self._settle(self.acks, msg.record_ack.run_id)
        elif kind == "deny":
            self._settle(self.admits, msg.deny.request_id, f"denied: {msg.deny.detail}")

    def start(self, rid: str, trace: bytes, request_id: int) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.admits[request_id] = fut
        self.live[rid] = 0
        rs = self.pb.RunStarted(
            run_id=rid,
            trace_id=trace.hex(),
            tenant=f"t{self.tenant}",
            agent="fleet-bench",
            started_at_unix=time.time(),
            request_id=request_id,
        )
        self.put(self.pb.AgentMessage(run_started=rs))
        return fut

    def end(self, rid: str) -> asyncio.Future:
        pb = self.pb
        fut = asyncio.get_running_loop().create_future()
        self.acks[rid] = fut
        steps = self.live.pop(rid, 0)
        usage = pb.Usage(steps=steps, model_calls=steps, tool_calls=2 * steps)
        usage.input_tokens, usage.output_tokens = 1200 * steps, 90 * steps
        now = time.time()
        outcome = pb.Outcome(
            run_id=rid,
            tenant=f"t{self.tenant}",
            agent="fleet-bench",
            status="completed",
            reason="final_answer",
            message="completed",
            usage=usage,
            decided_by="sdk",
            started_at_unix=now,
            ended_at_unix=now,
        )
        self.put(pb.AgentMessage(run_ended=pb.RunEnded(outcome=outcome)))
        return fut

    def beat(self) -> None:
        pb = self.pb
        runs = [
            pb.RunProgress(run_id=rid, usage=pb.Usage(steps=n, model_calls=n, tool_calls=2 * n))
            for rid, n in self.live.items()
        ]
        self.put(pb.AgentMessage(heartbeat=pb.Heartbeat(runs=runs)))


async def open_streams(
    address: str, old_agents: bool = False
) -> tuple[grpc.aio.Channel, list[_Stream]]:
    """One control stream per tenant, each with its Hello sent (``old_agents``: see above)."""
    from guard.v1 import guard_pb2 as pb
    from guard.v1 import guard_pb2_grpc

    channel = grpc.aio.insecure_channel(address)
    stub = guard_pb2_grpc.GuardControlStub(channel)
    streams = [_Stream(t, pb, stub, old_agents) for t in range(TENANTS)]
    for s in streams:
        hello = pb.Hello(process_id=f"fleet-{s.tenant}", tenant=f"t{s.tenant}")
        hello.accepts_batches = not old_agents
        s.put(pb.AgentMessage(hello=hello))
    return channel, streams


async def close_streams(kept: tuple[grpc.aio.Channel, list[_Stream]]) -> None:
    """Half-close every stream, wait (bounded) for the guard to end them, close."""
    channel, streams = kept
    for s in streams:
        s.queue.put_nowait(None)
    await asyncio.wait({s.reader for s in streams}, timeout=10)
    await channel.close()


async def drive_fleet(
    address: str,
    load: FleetLoad,
    streams: list[_Stream],
    *,
    prefix: str,
    concurrency: int,
    export: bool = True,
    requests: int | None = None,
) -> float:
    """Replay ``load`` (its first ``requests`` requests) with ``concurrency`` Export requests
    in flight; every run (ids under ``prefix``) registered before its first request, ended
    after its last one is acknowledged; the phase ends when every record is acknowledged.
    ``export=False``: the same control traffic without the spans. Returns wall seconds."""
    n = len(load.payloads) if requests is None else requests
    channel = grpc.aio.insecure_channel(
        address, options=[("grpc.max_send_message_length", 64 << 20)]
    )
    call = channel.unary_unary(EXPORT)
    remaining: dict[int, int] = {}
    for i in range(n):
        for k in load.runs_of[i]:
            remaining[k] = remaining.get(k, 0) + 1
    admitted: dict[int, asyncio.Future] = {}
    ended: list[asyncio.Future] = []
    request_ids = iter(range(1, 1 << 62))
    sent = [0] * TENANTS
    tenant_of = load.tenant_of_run

    def register(i: int) -> None:
        for k in load.runs_of[i]:
            if k not in admitted:
                s = streams[tenant_of[k]]
                admitted[k] = s.start(run_id(prefix, k), trace_of(prefix, k), next(request_ids))

    counter = iter(range(n))

    async def worker() -> None:
        for i in counter:
            register(i)
            if i + concurrency < n:
                register(i + concurrency)  # agents start their runs ahead of the spans
            await asyncio.gather(*(admitted[k] for k in load.runs_of[i]))
            t = load.tenants[i]
            if export:
                await call(load.payloads[i], metadata=auth_metadata(t), timeout=60)
            else:
                await asyncio.sleep(0)
            s = streams[t]
            for k in load.runs_of[i]:
                rid = run_id(prefix, k)
                s.live[rid] = s.live.get(rid, 0) + 1
                remaining[k] -= 1
                if remaining[k] == 0:
                    ended.append(s.end(rid))
            sent[t] += 1
            if sent[t] % HEARTBEAT_EVERY == 0:
                s.beat()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await asyncio.wait_for(asyncio.gather(*ended), 60)  # every record acknowledged
    wall = time.perf_counter() - t0
    await channel.close()
    return wall
