"""The control streams of the fleet load, and the driver that replays it (``_fleet``).

One Attach stream per tenant (one agent process each), speaking the protocol as the SDK
does: Hello first; RunStarted per run, its Admit acked; a Heartbeat with the live runs every
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

__all__ = ["HEARTBEAT_EVERY", "close_streams", "drive_exports", "drive_fleet", "open_streams"]

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
HEARTBEAT_EVERY = 8


class _Stream:
    """One tenant's agent process: its Attach stream and the runs it registered."""

    def __init__(self, tenant: int, pb: Any, stub: Any) -> None:
        self.pb = pb
        self.tenant = tenant
        self.queue: asyncio.Queue = asyncio.Queue()
        self.admits: dict[int, asyncio.Future] = {}  # request id -> admitted
        self.acks: dict[str, asyncio.Future] = {}  # run id -> record acknowledged
        self.live: dict[str, int] = {}  # run id -> steps so far
        self.messages_in = 0
        self.messages_out = 0
        self.call = stub.Attach(self._requests(), metadata=auth_metadata(tenant))
        self.reader = asyncio.ensure_future(self._read())

    def put(self, msg: Any) -> None:
        self.messages_out += 1
        self.queue.put_nowait(msg)

    async def _requests(self):
        while True:
            item = await self.queue.get()
            if item is None:
                return
            yield item

    @staticmethod
    def _settle(box: dict, key: Any, error: str | None = None) -> None:
        fut = box.pop(key, None)
        if fut is not None and not fut.done():
            if error is None:
                fut.set_result(True)
            else:
                fut.set_exception(RuntimeError(error))

    async def _read(self) -> None:
        pb = self.pb
        async for msg in self.call:
            self.messages_in += 1
            kind = msg.WhichOneof("body")
            if kind == "admit":
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


async def open_streams(address: str) -> tuple[grpc.aio.Channel, list[_Stream]]:
    """One control stream per tenant, each with its Hello sent."""
    from guard.v1 import guard_pb2 as pb
    from guard.v1 import guard_pb2_grpc

    channel = grpc.aio.insecure_channel(address)
    stub = guard_pb2_grpc.GuardControlStub(channel)
    streams = [_Stream(t, pb, stub) for t in range(TENANTS)]
    for s in streams:
        s.put(
            pb.AgentMessage(hello=pb.Hello(process_id=f"fleet-{s.tenant}", tenant=f"t{s.tenant}"))
        )
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


async def drive_exports(address: str, load: FleetLoad, n: int, concurrency: int) -> float:
    """Only the Export requests (each with its tenant's token): for the floor and rotel."""
    channel = grpc.aio.insecure_channel(
        address, options=[("grpc.max_send_message_length", 64 << 20)]
    )
    call = channel.unary_unary(EXPORT)
    counter = iter(range(n))

    async def worker() -> None:
        for i in counter:
            j = i % len(load.payloads)
            await call(load.payloads[j], metadata=auth_metadata(load.tenants[j]), timeout=60)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    await channel.close()
    return wall
