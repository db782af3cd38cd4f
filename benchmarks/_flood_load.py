"""Tenant A's span load for ``bench_flood.py``: pre-built 512-span Export bodies and the
flooder process (``bench_flood.py --role flood``).

A flooder process builds its bodies before it reports ready, registers its own "known" runs
over its own GuardControl stream (RunStarted -> Admit, the stream held open until it quits),
then obeys lines on stdin, each answered by one JSON line on stdout:

* ``capacity WARM SECS``: closed loop, :data:`CLOSED_LOOP_INFLIGHT` requests in flight, the
  answers of the first ``WARM`` seconds not counted;
* ``flood RATE SECS``: open loop, ``RATE`` requests/s sent on schedule whatever the answers
  (at most :data:`OPEN_LOOP_INFLIGHT` in flight: a request due while that many wait is
  counted as ``skipped``, not sent);
* ``rest``: close the span transport's connections (the control stream stays open);
* ``quit``.

Its bodies mix three kinds, 6:1:1 — ``new``: spans of never-registered run ids, 4 per run,
more ids than ``max_tracked_runs`` across the flooders (replayed in a cycle, so an id comes
back after the guard made room by forgetting it); ``known``: spans of the runs this process
registered; ``repeat``: spans of a fixed set of span-only run ids, sent again and again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import queue
import sys
import threading
import time
from collections import Counter
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from guard.v1 import guard_pb2 as pb
from guard.v1 import guard_pb2_grpc

__all__ = ["BATCH", "build_bodies", "flood_main", "md", "span_request"]

BATCH = 4096  # spans per Export request (large, so that the flooders can offer 5x capacity)
NEW_PER_RUN = 4  # spans per new run id in a "new" body
KNOWN_RUNS = 64  # runs each flooder registers on its control stream
REPEAT_RUNS = 64  # span-only run ids each flooder sends again and again
CLOSED_LOOP_INFLIGHT = 16
OPEN_LOOP_INFLIGHT = 1024
GRPC_CHANNELS = 4  # connections per gRPC flooder (the guard bounds streams per connection)
REQUEST_TIMEOUT_S = 5.0
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def md(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def _kv(key: str, value: str | int) -> common_pb2.KeyValue:
    if isinstance(value, int):
        return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(int_value=value))
    return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(string_value=value))


def span_request(run_ids: list[str], salt: int = 0) -> bytes:
    """One serialized ExportTraceServiceRequest: a chat span (10 input tokens, 1 output
    token) per entry of ``run_ids``."""
    spans = []
    for i, rid in enumerate(run_ids):
        trace = hashlib.md5(rid.encode()).digest()
        spans.append(
            trace_pb2.Span(
                name="chat m",
                trace_id=trace,
                span_id=((salt << 20 | i) + 1).to_bytes(8, "big"),
                start_time_unix_nano=1,
                end_time_unix_nano=2,
                attributes=[
                    _kv("gen_ai.operation.name", "chat"),
                    _kv("gen_ai.request.model", "m"),
                    _kv("gen_ai.usage.input_tokens", 10),
                    _kv("gen_ai.usage.output_tokens", 1),
                    _kv("guard.run.id", rid),
                ],
            )
        )
    req = otlp.ExportTraceServiceRequest(resource_spans=[{"scope_spans": [{"spans": spans}]}])
    return req.SerializeToString()


def build_bodies(tag: str, new_ids: int) -> tuple[list[tuple[str, bytes]], list[str]]:
    """(kind, body) in sending order, and the run ids to register (the ``known`` ones)."""
    known = [f"a-known-{tag}-{j}" for j in range(KNOWN_RUNS)]
    repeat = [f"a-rep-{tag}-{j}" for j in range(REPEAT_RUNS)]
    per_body = BATCH // NEW_PER_RUN
    new = []
    for b in range(math.ceil(new_ids / per_body)):
        ids = [f"a-new-{tag}-{b * per_body + k}" for k in range(per_body)]
        new.append(span_request([r for r in ids for _ in range(NEW_PER_RUN)], salt=b))
    side = [
        (kind, span_request([ids[i % len(ids)] for i in range(BATCH)], salt=1000 + s))
        for s in range(4)
        for kind, ids in (("known", known), ("repeat", repeat))
    ]
    out: list[tuple[str, bytes]] = []
    for i, body in enumerate(new):
        out.append(("new", body))
        if i % 3 == 2:
            out.append(side[(i // 3) % len(side)])
    return out, known


class _Registrar:
    """The flooder's own control stream: registers ``run_ids``, acks whatever comes, and
    stays open until :meth:`close`."""

    def __init__(self, address: str, token: str, run_ids: list[str], tag: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.outbox: queue.Queue[pb.AgentMessage | None] = queue.Queue()
        self.admitted: set[str] = set()
        self.all_in = threading.Event()
        self.wanted = set(run_ids)
        self.outbox.put(pb.AgentMessage(hello=pb.Hello(process_id=f"flood-{tag}", tenant="a")))
        for i, rid in enumerate(run_ids):
            rs = pb.RunStarted(run_id=rid, agent="flooder", request_id=i + 1)
            self.outbox.put(pb.AgentMessage(run_started=rs))
        stub = guard_pb2_grpc.GuardControlStub(self.channel)
        self.call = stub.Attach(iter(self.outbox.get, None), metadata=md(token))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for msg in self.call:
                body = msg.WhichOneof("body")
                if body == "admit":
                    self.admitted.add(msg.admit.run_id)
                    if self.wanted <= self.admitted:
                        self.all_in.set()
                if msg.command_id:
                    rid = getattr(getattr(msg, body), "run_id", "") if body else ""
                    ack = pb.Ack(command_id=msg.command_id, run_id=rid, applied=True)
                    self.outbox.put(pb.AgentMessage(ack=ack))
        except grpc.RpcError:
            pass

    def close(self) -> None:
        self.outbox.put(None)
        self.channel.close()


class _Sender:
    """Sends bodies over one transport and tallies the answers."""

    def __init__(self, transport: str, address: str, http_url: str, token: str) -> None:
        self.transport = transport
        self.token = token
        self.http_url = http_url
        opts = [("grpc.max_send_message_length", 64 << 20), ("grpc.use_local_subchannel_pool", 1)]
        self.channels = [
            grpc.aio.insecure_channel(address, options=opts) for _ in range(GRPC_CHANNELS)
        ]
        self.exports = [ch.unary_unary(EXPORT) for ch in self.channels]
        self.session: Any = None
        self.closed = False
        self.inflight = 0
        self.reset()

    def reset(self) -> None:
        self.sent = 0
        self.accepted_spans = 0
        self.rejected_spans = 0
        self.outcomes: Counter = Counter()
        self.details: dict[str, str] = {}  # outcome -> the first error text seen
        self.kinds: Counter = Counter()
        self.latency_ms: list[float] = []

    async def open(self) -> None:
        if self.transport == "http":
            import aiohttp

            conn = aiohttp.TCPConnector(limit=OPEN_LOOP_INFLIGHT, force_close=False)
            self.session = aiohttp.ClientSession(connector=conn)

    async def close(self) -> None:
        self.closed = True
        if self.session is not None:
            await self.session.close()
        for ch in self.channels:
            await ch.close()

    async def send(self, kind: str, body: bytes) -> None:
        self.sent += 1
        self.kinds[kind] += 1
        self.inflight += 1
        t0 = time.perf_counter()
        try:
            if self.transport == "grpc":
                outcome, data = await self._grpc(body)
            else:
                outcome, data = await self._http(body)
        finally:
            self.inflight -= 1
        self.latency_ms.append((time.perf_counter() - t0) * 1e3)
        self.outcomes[outcome] += 1
        if outcome == "ok":
            rejected = otlp.ExportTraceServiceResponse.FromString(data).partial_success
            self.rejected_spans += rejected.rejected_spans
            self.accepted_spans += BATCH - rejected.rejected_spans

    async def _grpc(self, body: bytes) -> tuple[str, bytes]:
        try:
            export = self.exports[self.sent % len(self.exports)]
            data = await export(body, metadata=md(self.token), timeout=REQUEST_TIMEOUT_S)
            return "ok", data
        except grpc.aio.AioRpcError as e:
            self.details.setdefault(f"grpc_{e.code().name}", (e.details() or "")[:200])
            return f"grpc_{e.code().name}", b""

    async def _http(self, body: bytes) -> tuple[str, bytes]:
        headers = {
            "content-type": "application/x-protobuf",
            "authorization": f"Bearer {self.token}",
        }
        try:
            async with self.session.post(
                self.http_url, data=body, headers=headers, timeout=REQUEST_TIMEOUT_S
            ) as resp:
                data = await resp.read()
                if resp.status != 200:
                    text = data.decode(errors="replace")[:200]
                    self.details.setdefault(f"http_{resp.status}", text)
                return ("ok" if resp.status == 200 else f"http_{resp.status}"), data
        except TimeoutError:
            return "http_timeout", b""
        except Exception as e:  # connection refused / reset under load: counted, not fatal
            self.details.setdefault(f"http_{type(e).__name__}", str(e)[:200])
            return f"http_{type(e).__name__}", b""

    def report(self, secs: float) -> dict[str, Any]:
        lat = sorted(self.latency_ms)

        def q(p: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))], 1) if lat else None

        return {
            "transport": self.transport,
            "secs": round(secs, 3),
            "requests_sent": self.sent,
            "spans_offered": self.sent * BATCH,
            "spans_accepted": self.accepted_spans,
            "spans_rejected_in_ok_answers": self.rejected_spans,
            "outcomes": dict(self.outcomes),
            "error_details": dict(self.details),
            "kinds": dict(self.kinds),
            "answer_ms": {"p50": q(0.5), "p99": q(0.99), "max": q(1.0)},
        }


async def _closed(
    sender: _Sender, bodies: list, secs: float, warm_s: float, inflight: int
) -> dict[str, Any]:
    """Closed loop for ``warm_s + secs``; the answers of the first ``warm_s`` not counted."""
    deadline = time.perf_counter() + warm_s + secs
    cursor = [0]
    loop = asyncio.get_running_loop()
    loop.call_later(warm_s, sender.reset)

    async def worker() -> None:
        while time.perf_counter() < deadline:
            i = cursor[0] = cursor[0] + 1
            await sender.send(*bodies[i % len(bodies)])

    t0 = time.perf_counter() + warm_s
    await asyncio.gather(*(worker() for _ in range(inflight)))
    out = sender.report(time.perf_counter() - t0)
    out["inflight"] = inflight
    return out


async def _open(sender: _Sender, bodies: list, rate: float, secs: float) -> dict[str, Any]:
    """Open loop: request k is due at t0 + k / rate; sent then unless too many wait."""
    sender.reset()
    skipped = 0
    tasks: set[asyncio.Task] = set()
    t0 = time.perf_counter()
    due = 0
    while (now := time.perf_counter()) < t0 + secs:
        target = int((now - t0) * rate)
        while due < target:
            if sender.inflight >= OPEN_LOOP_INFLIGHT:
                skipped += 1
            else:
                t = asyncio.ensure_future(sender.send(*bodies[due % len(bodies)]))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
            due += 1
        await asyncio.sleep(0.002)
    elapsed = time.perf_counter() - t0
    out = sender.report(elapsed)  # what was sent within the window; answers still coming
    out["answered_in_window"] = sum(sender.outcomes.values())
    if tasks:
        await asyncio.wait(tasks, timeout=REQUEST_TIMEOUT_S + 1)
    late = sender.report(time.perf_counter() - t0)
    out.update(
        target_rps=rate,
        skipped_inflight_full=skipped,
        spans_accepted_in_window=out["spans_accepted"],
        spans_accepted=late["spans_accepted"],
        outcomes=late["outcomes"],
        error_details=late["error_details"],
        answer_ms=late["answer_ms"],
    )
    return out


async def _serve(args: Any) -> None:
    bodies, known = build_bodies(args.tag, args.new_ids)
    reg = _Registrar(args.address, args.token, known, args.tag)
    registered = reg.all_in.wait(30)
    sender = _Sender(args.transport, args.address, args.http_url, args.token)
    await sender.open()
    await sender.send(*bodies[0])  # connect before the first timed phase
    loop = asyncio.get_running_loop()
    print(json.dumps({"event": "ready", "bodies": len(bodies), "registered": registered}))
    sys.stdout.flush()
    try:
        while True:
            line = (await loop.run_in_executor(None, sys.stdin.readline)).split()
            if not line or line[0] == "quit":
                break
            if line[0] == "rest":  # the flood is over: close this transport's connections
                await sender.close()
                out = {"event": "rested"}
            elif line[0] == "capacity":
                inflight = int(line[3]) if len(line) > 3 else CLOSED_LOOP_INFLIGHT
                out = await _closed(sender, bodies, float(line[2]), float(line[1]), inflight)
            else:
                out = await _open(sender, bodies, float(line[1]), float(line[2]))
            out["known_runs_admitted"] = len(reg.admitted)
            print(json.dumps(out), flush=True)
    finally:
        if not sender.closed:
            await sender.close()
        reg.close()


def flood_main(args: Any) -> int:
    # At the lowest CPU priority: on this machine the flooders share 2 cores with the guard
    # and the canaries, and a canary starved of CPU by them would charge its own wait to the
    # guard's control plane (on a real deployment the flood comes from other machines).
    os.nice(19)
    asyncio.run(_serve(args))
    return 0
