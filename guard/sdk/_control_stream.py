"""One session of the control stream: the Hello, then reader, writer and heartbeat tasks.

A part of :class:`guard.sdk._control.ControlClient` (its base class): the client owns the
state (the live runs, the admissions waiting, the unacknowledged records, the counters) and
the connection loop; this holds what one stream to one guard does with it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any

from guard.policy import Budget
from guard.sdk._channel import open_channel, wait_connected
from guard.sdk._control_inbox import handle
from guard.v1 import guard_pb2 as pb
from guard.v1 import guard_pb2_grpc as pb_grpc
from guard.wire import take_batch, usage_to_pb

if TYPE_CHECKING:  # pragma: no cover
    from guard.sdk._targets import Address

__all__ = ["HALF_CLOSE", "ControlStream"]

log = logging.getLogger("guard.sdk.control")
_CONNECT_TIMEOUT_S = 1.0  # a guard that accepts TCP but never answers does not hold failover
HALF_CLOSE: Any = object()  # queue sentinel: shutdown's "no more messages"


def _is_half_close(item: Any) -> bool:
    return item is HALF_CLOSE


class ControlStream:
    """The session methods of the control client (see the module docstring)."""

    # state of ControlClient that a session reads and writes
    settings: Any
    route: Any
    counters: Any
    unacked: Any
    process_id: str
    heartbeat_s: float
    guard_batches: bool
    _call: Any
    _queue: Any
    _lock: Any
    _runs: dict[str, Any]
    _admissions: dict[int, Any]
    if TYPE_CHECKING:  # ControlClient's

        def _run_started(self, run: Any, rid: int, snapshot: Any = None) -> pb.RunStarted: ...

    async def _session(self, addr: Address) -> bool:
        self.route.trying(addr)
        channel = open_channel(self.settings, addr)
        established = False
        try:
            metadata = (
                (("authorization", f"Bearer {self.settings.token}"),) if self.settings.token else ()
            )
            call = pb_grpc.GuardControlStub(channel).Attach(metadata=metadata)
            self._call = call
            q: asyncio.Queue[pb.AgentMessage] = asyncio.Queue()
            self._queue = q  # from here on new messages queue for this stream
            self.guard_batches = False  # until this guard's Welcome says otherwise
            await wait_connected(channel, _CONNECT_TIMEOUT_S)
            with self._lock:
                live = list(self._runs.values())
                rid_of = {r: rid for rid, (_, r) in self._admissions.items()}
            # each run tree's (usage, seq) at one instant: a parent's usage holds its children's
            snaps = Budget.snapshot_all([r.budget for r in live])
            hello = pb.Hello(
                process_id=self.process_id,
                host=socket.gethostname(),
                pid=os.getpid(),
                tenant=self.settings.tenant,
                sdk_version=_version(),
                live_runs=[
                    self._run_started(r, rid_of.get(r.run_id, 0), snap)
                    for r, snap in zip(live, snaps, strict=True)
                ],
                ended_runs=self.unacked.acked_recently(),
                accepts_batches=True,
                agent_time_unix=time.time(),  # the guard measures this process's clock skew
            )
            await call.write(pb.AgentMessage(hello=hello))
            for m in self.unacked.all():  # every record the guard has not acknowledged
                await call.write(m)
            welcomes = self.counters["welcomes"]
            reader = asyncio.ensure_future(self._read(call))
            writer = asyncio.ensure_future(self._write(call, q))
            beat = asyncio.ensure_future(self._heartbeat(q))
            try:
                # The stream lives until the guard ends it or a write fails.
                await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
                if not reader.done() and not writer.cancelled() and writer.exception() is None:
                    # Half-closed by shutdown: wait for the guard to end the stream, i.e. to
                    # have read the last RunEnded (the shutdown timer bounds this wait).
                    await asyncio.wait({reader})
            finally:
                for t in (writer, beat, reader):
                    t.cancel()
                await asyncio.gather(writer, beat, reader, return_exceptions=True)
            established = self.counters["welcomes"] > welcomes
        finally:
            await channel.close(grace=None)
        return established

    async def _write(self, call: Any, q: asyncio.Queue[pb.AgentMessage]) -> None:
        """Write what is queued, in order: to a guard that reads batches, whatever is ready
        at once goes as one AgentBatch (one grpc message instead of one per message)."""
        carry: Any = None
        while True:
            first = carry if carry is not None else await q.get()
            if self.guard_batches:
                batch, carry = take_batch(q, first, _is_half_close)
            else:
                batch, carry = [first], None
            closing = batch[-1] is HALF_CLOSE
            if closing:
                batch.pop()
            # a RunEnded lost here is resent after the reconnect
            if len(batch) > 1:
                self.counters["batches_out"] += 1
                await call.write(pb.AgentMessage(batch=pb.AgentBatch(messages=batch)))
            elif batch:
                await call.write(batch[0])
            if closing:
                # Shutdown: everything queued before it is written (each write awaited).
                # Half-close; the guard ends the stream once it has read every message.
                await call.done_writing()
                return

    async def _heartbeat(self, q: asyncio.Queue[pb.AgentMessage]) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            with self._lock:
                live = list(self._runs.values())
            beat = pb.Heartbeat(
                runs=[
                    pb.RunProgress(
                        run_id=r.run_id, usage=usage_to_pb(r.budget.usage()), paused=r.paused
                    )
                    for r in live
                ]
            )
            q.put_nowait(pb.AgentMessage(heartbeat=beat))

    async def _read(self, call: Any) -> None:
        async for msg in call:
            try:
                handle(self, msg)  # type: ignore[arg-type]  # self is the ControlClient
            except Exception:
                self.counters["errors"] += 1
                log.exception("otel-guard: handling a guard message failed")


def _version() -> str:
    from guard import __version__

    return __version__
