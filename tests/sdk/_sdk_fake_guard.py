"""A minimal in-test GuardControl servicer on a real grpc server (127.0.0.1:0)."""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from guard.v1 import guard_pb2 as pb
from guard.v1 import guard_pb2_grpc as pb_grpc

__all__ = ["FakeGuard"]


class FakeGuard(pb_grpc.GuardControlServicer):
    """Answers Hello with Welcome and RunStarted with ``decide(run_started) -> GuardMessage``
    (or nothing when it returns None). Records every AgentMessage."""

    def __init__(
        self,
        decide: Callable[[pb.RunStarted], pb.GuardMessage | None] | None = None,
        *,
        read_delay_s: float = 0.0,
        heartbeat_interval_ms: int = 100,
        ack_records: bool = True,
        port: int = 0,
        accepts_batches: bool = False,
    ):
        """``read_delay_s``: a slow guard, pausing before it reads each message after Hello.
        ``ack_records``: answer each RunEnded with a RecordAck, as the real guard does.
        ``port``: a fixed port (a guard restarted where the agents look for it).
        ``accepts_batches``: the Welcome says so; each AgentBatch is recorded in ``batches``
        and its messages handled one by one (``received`` holds them, not the batch)."""
        self.ack_records = ack_records
        self.accepts_batches = accepts_batches
        self.batches: list[pb.AgentBatch] = []
        self.decide = decide or (
            lambda rs: pb.GuardMessage(
                admit=pb.Admit(run_id=rs.run_id, request_id=rs.request_id, effective=rs.requested)
            )
        )
        self.read_delay_s = read_delay_s
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.stream_ends: list[str] = []  # how each stream ended: "agent" (half-close) / "error"
        self.received: list[pb.AgentMessage] = []
        self.metadata: list[dict] = []
        self.streams: list[queue.Queue[Any]] = []
        self.cond = threading.Condition()
        self._ids = itertools.count(1)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pb_grpc.add_GuardControlServicer_to_server(self, self.server)
        self.traces = _Traces()
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self.traces, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.server.start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop(None)

    def send(self, **body: Any) -> int:
        """Push a GuardMessage (e.g. ``cancel=pb.Directive(...)``) on the newest stream."""
        cid = next(self._ids)
        self.streams[-1].put(pb.GuardMessage(command_id=cid, sent_at_unix=time.time(), **body))
        return cid

    def drop_stream(self) -> None:
        self.streams[-1].put(None)

    def wait(self, pred: Callable[[pb.AgentMessage], bool], timeout: float = 5.0):
        """The first message received that matches ``pred`` (woken by each arrival; bounded),
        or None."""

        def first() -> Any:
            return next((m for m in self.received if pred(m)), None)

        with self.cond:
            self.cond.wait_for(lambda: first() is not None, timeout)
            return first()

    def of(self, kind: str) -> list[Any]:
        with self.cond:
            return [getattr(m, kind) for m in self.received if m.WhichOneof("body") == kind]

    def Attach(self, request_iterator, context):
        out: queue.Queue[Any] = queue.Queue()
        self.metadata.append(dict(context.invocation_metadata()))
        self.streams.append(out)

        def reader() -> None:
            try:
                for frame in request_iterator:
                    if self.read_delay_s and frame.WhichOneof("body") != "hello":
                        time.sleep(self.read_delay_s)  # behind: the agent's writes queue up
                    self._handle(frame, out)
                end = "agent"
            except grpc.RpcError:
                end = "error"
            with self.cond:
                self.stream_ends.append(end)
                self.cond.notify_all()
            out.put(None)

        threading.Thread(target=reader, daemon=True).start()
        while True:
            item = out.get()
            if item is None or not context.is_active():
                return
            yield item

    def _handle(self, frame: pb.AgentMessage, out: queue.Queue[Any]) -> None:
        if frame.WhichOneof("body") == "batch":
            with self.cond:
                self.batches.append(frame.batch)
            messages = list(frame.batch.messages)
        else:
            messages = [frame]
        for msg in messages:
            with self.cond:
                self.received.append(msg)
                self.cond.notify_all()
            kind = msg.WhichOneof("body")
            if kind == "hello":
                out.put(
                    pb.GuardMessage(
                        command_id=next(self._ids),
                        welcome=pb.Welcome(
                            guard_id="fake",
                            heartbeat_interval_ms=self.heartbeat_interval_ms,
                            accepts_batches=self.accepts_batches,
                        ),
                    )
                )
            elif kind == "run_started":
                reply = self.decide(msg.run_started)
                if reply is not None:
                    reply.command_id = next(self._ids)
                    out.put(reply)
            elif kind == "run_ended" and self.ack_records:
                rid = msg.run_ended.outcome.run_id
                out.put(
                    pb.GuardMessage(command_id=next(self._ids), record_ack=pb.RecordAck(run_id=rid))
                )


class _Traces(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every OTLP export request as received (serialized bytes)."""

    def __init__(self) -> None:
        self.raw: list[bytes] = []

    def Export(self, request, context):
        self.raw.append(request.SerializeToString())
        return trace_service_pb2.ExportTraceServiceResponse()
