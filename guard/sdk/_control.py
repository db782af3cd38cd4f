"""The control-stream client: ``GuardControl.Attach`` on a background thread.

The client runs its own asyncio loop on a daemon thread, so it never blocks the agent's
thread or event loop; agent threads only hand it messages with ``call_soon_threadsafe``.
The protocol, as in ``guard.proto``: Hello first (with the live runs after a
reconnect) -> Welcome; RunStarted -> Admit / Deny; warn / wrap_up / cancel directives at any
time, each acked; a Heartbeat with the live runs' usage; RunEnded for every run. With several
guards (``endpoint="g1:4317,g2:4317"`` or a name with several addresses, ``_targets``) a failed
connect or a dropped stream moves on to the next guard at once, and the jittered exponential
backoff applies per full cycle over them; the Hello re-registers the live runs with their
counters on whichever guard the stream reaches. Every RunEnded is kept until the guard's
RecordAck and sent again after each reconnect (``_records.PendingRecords``); shutdown waits,
bounded by ``Settings.shutdown_ack_timeout_s``, for the acknowledgements. Nothing here raises
into user code. The Hello says the client reads ``GuardBatch`` (``accepts_batches``; then it
does not ack an Admit, which nothing waits for); to a guard whose Welcome says the same, what
is queued at once goes out as one ``AgentBatch`` (grpc.aio costs per stream message).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import itertools
import logging
import random
import threading
import uuid
from typing import TYPE_CHECKING, Any

import grpc

from guard.sdk._allowance_desk import AllowanceDesk
from guard.sdk._control_stream import HALF_CLOSE as _HALF_CLOSE
from guard.sdk._control_stream import ControlStream
from guard.sdk._records import PendingRecords
from guard.sdk._targets import Address, Route, TargetRing
from guard.v1 import guard_pb2 as pb
from guard.wire import limits_to_pb, outcome_to_pb, usage_to_pb

if TYPE_CHECKING:  # pragma: no cover
    from guard.policy import Outcome
    from guard.sdk._config import Settings
    from guard.sdk._run import LiveRun
    from guard.sdk._runtime import Runtime

__all__ = ["ControlClient"]

log = logging.getLogger("guard.sdk.control")
_DRAIN_RECONNECT_S = 0.25  # backoff cap while shutdown waits for acknowledgements


class ControlClient(ControlStream):
    """One stream per process, multiplexing all of its runs. Thread-safe public methods."""

    def __init__(self, settings: Settings, rt: Runtime) -> None:
        self.settings = settings
        self.rt = rt
        self.process_id = uuid.uuid4().hex
        self.heartbeat_s = settings.heartbeat_interval_ms / 1000.0
        self.connected = threading.Event()
        self.first_attempt_done = threading.Event()
        self.counters = collections.Counter[str]()
        self.guard_id = ""
        self.guard_batches = False  # the guard's Welcome said it reads AgentMessage.batch
        self._runs: dict[str, LiveRun] = {}
        self._admissions: dict[int, tuple[concurrent.futures.Future[Any], str]] = {}
        self._request_ids = itertools.count(1)
        self._lock = threading.Lock()
        self.allowances = AllowanceDesk(self)  # the tenant ceilings of this process's runs
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[pb.AgentMessage] | None = None
        self.unacked = PendingRecords()  # RunEnded records until the guard's RecordAck
        # runs whose RunStarted the guard refused (control thread only; bounded, oldest out)
        self.rejected_runs: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._draining = False  # shutdown is waiting for acknowledgements
        self._main: asyncio.Task[None] | None = None
        self._stopping = False
        self._wakeup: asyncio.Event | None = None
        self._call: Any = None
        self.ring = TargetRing(settings.endpoint or "")
        self.route: Route = getattr(rt, "route", None) or Route()  # the span export follows it
        self._failing_over = False  # a stream dropped and the cycle has guards left to try
        self._thread = threading.Thread(
            target=self._thread_main, name="otel-guard-control", daemon=True
        )
        self._started = threading.Event()

    # -- agent-side API (any thread, never blocks) -------------------------------------------
    def start(self) -> None:
        self._thread.start()
        self._started.wait(2.0)

    def register(
        self, run: LiveRun, *, wait: bool = False
    ) -> concurrent.futures.Future[Any] | None:
        """Send RunStarted. Returns a future resolved on Admit/Deny, or ``None`` when the
        guard is known to be unreachable (fail-open) and ``wait`` is False."""
        rid = next(self._request_ids)
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            self._runs[run.run_id] = run
            self._admissions[rid] = (fut, run.run_id)
        run._request_id = rid  # type: ignore[attr-defined]
        self._send(pb.AgentMessage(run_started=self._run_started(run, rid)))
        if (
            self.connected.is_set()
            or not self.first_attempt_done.is_set()
            or self._failing_over  # the next guard's Hello carries it: wait for its answer
            or wait
        ):
            return fut
        self._resolve(rid, None)
        return None

    def run_ended(self, run: LiveRun, outcome: Outcome) -> None:
        with self._lock:
            self._runs.pop(run.run_id, None)
            rid = getattr(run, "_request_id", None)
        if rid is not None:
            self._resolve(rid, None)
        msg = pb.AgentMessage(run_ended=pb.RunEnded(outcome=outcome_to_pb(outcome)))
        self.unacked.add(run.run_id, msg)
        self._send(msg)

    def stop(self, timeout_s: float = 2.0, ack_timeout_s: float | None = None) -> None:
        """Wait (bounded by ``ack_timeout_s``, default ``Settings.shutdown_ack_timeout_s``)
        for the guard to acknowledge every termination record, reconnecting meanwhile; then
        flush what is queued (bounded by ``timeout_s``), close the stream and end the thread.
        Records still unacknowledged are named in one warning line."""
        wait_s = self.settings.shutdown_ack_timeout_s if ack_timeout_s is None else ack_timeout_s
        if len(self.unacked) and wait_s > 0 and threading.current_thread() is not self._thread:
            self._draining = True
            self._wake()  # a reconnect sleeping out its backoff tries again now
            self.unacked.wait_empty(wait_s)
        lost = self.unacked.run_ids()
        if lost:
            self.counters["records_unacknowledged"] += len(lost)
            log.warning(
                "otel-guard: shutdown gave up after %.1fs: the guard did not acknowledge the "
                "termination records of %d run(s): %s",
                wait_s,
                len(lost),
                " ".join(lost),
            )
        self._stopping = True
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # loop already closing
                asyncio.run_coroutine_threadsafe(self._shutdown(timeout_s / 2), loop)
        if threading.current_thread() is not self._thread:  # e.g. shutdown() in a callback
            self._thread.join(timeout_s)
        with self._lock:
            pending = list(self._admissions)
        for rid in pending:
            self._resolve(rid, None)

    def unregister(self, run_id: str, request_id: int = 0) -> None:
        """The guard refused the run's RunStarted: the run goes on without the guard (fail
        open, as when no guard answers): its admission wait ends with no answer, and it is
        no longer a live run of the stream (a Hello after a reconnect would carry it again,
        and be refused whole). Its RunEnded is still sent (the record may be kept)."""
        with self._lock:
            if request_id:  # the guard cuts a long run id: the request names the run
                run_id = next(
                    (rid for rid, r in self._runs.items() if _request_of(r) == request_id),
                    run_id,
                )
            else:
                request_id = next(
                    (rid for rid, (_, r) in self._admissions.items() if r == run_id), 0
                )
            run = self._runs.get(run_id)
            if run is not None and _request_of(run) in (request_id, None):
                del self._runs[run_id]
        if request_id:
            self._resolve(request_id, None)

    def next_request_id(self) -> int:
        """A request id unique on this client (RunStarted, AllowanceRequest)."""
        return next(self._request_ids)

    def live_run(self, run_id: str) -> LiveRun | None:
        """The registered run of that id, if it is still live here. Caller holds ``_lock``."""
        return self._runs.get(run_id)

    # -- helpers ----------------------------------------------------------------------------
    def _run_started(self, run: LiveRun, rid: int, snapshot: Any = None) -> pb.RunStarted:
        msg = pb.RunStarted(
            run_id=run.run_id,
            trace_id=run.trace_id,
            parent_run_id=run.parent_run_id or "",
            tenant=run.tenant,
            agent=run.agent,
            requested=limits_to_pb(run.requested),
            started_at_unix=run.started_at,
            request_id=rid,
        )
        if snapshot is not None:  # re-registration: (usage, seq) read at one instant
            msg.usage.CopyFrom(usage_to_pb(snapshot[0]))
            msg.span_seq = snapshot[1]
        return msg

    def _send(self, msg: pb.AgentMessage) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # loop shutting down
            loop.call_soon_threadsafe(self._enqueue, msg)

    def _enqueue(self, msg: pb.AgentMessage) -> None:
        q = self._queue
        if q is not None:
            q.put_nowait(msg)
        # Disconnected: the next Hello carries the live runs, and every unacknowledged
        # RunEnded is sent again after it (self.unacked).

    def _resolve(self, rid: int, value: Any) -> None:
        with self._lock:
            entry = self._admissions.pop(rid, None)
        if entry is not None and not entry[0].done():
            # The waiter may have timed out and cancelled it meanwhile.
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                entry[0].set_result(value)

    # -- the thread -------------------------------------------------------------------------
    def _thread_main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._main = loop.create_task(self._run_forever())
            self._started.set()
            loop.run_until_complete(self._main)
        except BaseException:
            log.debug("control thread ended", exc_info=True)
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()
                self._loop = None

    async def _run_forever(self) -> None:
        """Connect, hold the stream, and when it ends try the next guard: immediately after a
        failed connect while this cycle has guards left, after a short jitter when an
        established stream dropped, and with jittered exponential backoff once every guard of
        the cycle failed (never a hot loop)."""
        backoff = self.settings.reconnect_min_s
        cycle: list[Address] = []
        last: str | None = None
        while not self._stopping:
            if not cycle:  # a new cycle: resolve the names again, go on after the last one
                cycle = await self.ring.resolve(after=last)
            addr = cycle.pop(0)
            last = addr.target
            established = False
            try:
                established = await self._session(addr)
            except asyncio.CancelledError:
                if self._stopping:
                    return
            except Exception as exc:
                self._count_error(exc)
            finally:
                self._on_disconnect(more=bool(cycle) or established)
            if self._stopping:
                return
            if established:
                backoff = self.settings.reconnect_min_s
                cycle = []  # the next cycle starts at the guard after this one
                delay = backoff * random.uniform(0.5, 1.0)  # full jitter: no herd
            elif cycle:
                self.counters["failovers"] += 1
                continue  # the next guard of this cycle, now
            else:
                delay = backoff * random.uniform(0.5, 1.0)
                backoff = min(backoff * 2, self.settings.reconnect_max_s)
            if self._draining:  # shutdown is waiting for acks: keep trying, briefly
                delay = min(delay, _DRAIN_RECONNECT_S)
            self.counters["reconnects"] += 1
            self._wakeup = asyncio.Event()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), delay)

    def _count_error(self, exc: Exception) -> None:
        self.counters["errors"] += 1
        code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            self.counters["auth_errors"] += 1
            if self.counters["auth_errors"] == 1:  # once: a wrong token is not transient
                assert isinstance(exc, grpc.aio.AioRpcError)  # it has a code
                log.warning("otel-guard: the guard refused the stream: %s", exc.details())
        else:
            log.debug("otel-guard control stream error: %r", exc)

    def _wake(self) -> None:
        loop, ev = self._loop, self._wakeup
        if loop is not None and ev is not None:
            with contextlib.suppress(RuntimeError):  # loop closed
                loop.call_soon_threadsafe(ev.set)

    def _on_disconnect(self, more: bool = False) -> None:
        """``more``: another guard is tried right away, so runs waiting for an admission keep
        waiting (bounded by their own timeout) for the next guard's answer."""
        was = self.connected.is_set()
        self.connected.clear()
        self.route.down()
        self.first_attempt_done.set()
        self._failing_over = more
        self._queue = None  # what it still held: unacked RunEnded go again after the Hello
        self._call = None
        if was:
            self.counters["disconnects"] += 1
            log.info("otel-guard: control stream lost; runs continue under local limits")
        if more:
            return
        with self._lock:
            pending = list(self._admissions)
        for rid in pending:  # fail-open: waiting runs proceed at once
            self._resolve(rid, None)

    async def _shutdown(self, drain_s: float) -> None:
        """End the session cleanly within ``drain_s``: the queued messages (the last RunEnded
        records) are written, the stream is half-closed, and the session ends when the guard
        ends the stream, which it does once it has read everything. Cancelling the stream
        as soon as the queue looked empty could lose a write still in flight."""
        main = self._main
        if main is None or main.done():
            return
        q = self._queue
        if q is None or self._call is None:
            main.cancel()  # not connected: nothing can be delivered
            return
        q.put_nowait(_HALF_CLOSE)  # after everything queued (FIFO)
        # The bound: a guard that never ends the stream does not hold the process.
        asyncio.get_running_loop().call_later(drain_s, main.cancel)


def _request_of(run: Any) -> int | None:
    """The request id of the run's RunStarted (``register`` sets it)."""
    return getattr(run, "_request_id", None)
