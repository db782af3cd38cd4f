"""Decision fan-out: one :class:`AgentSession` per attached agent process.

Every command the guard sends carries a ``command_id`` unique on its stream. Decisions (warn,
wrap_up, cancel, deny) wait in ``pending`` until the agent acks them; the ack gives the
delivery latency (ack received - command sent) and only then is the ``DecisionRecord``
handed to the sink. Commands never acked (agent gone, stream closed) are written after
:data:`ACK_TIMEOUT_S` with ``delivery_latency_ms=None``.

Everything here runs on the server's event loop: ``put_nowait`` on an unbounded queue is the
only hand-off, so the ingest path never awaits a slow agent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from guard.records import DecisionRecord
from guard.server.runtime._ordered import OrderedSet
from guard.wire import directive_to_pb, envelope_to_pb

__all__ = ["ACK_TIMEOUT_S", "AgentSession", "DecisionLog", "Outbox"]

log = logging.getLogger("guard.server.fanout")

ACK_TIMEOUT_S = 10.0
_CLOSE = object()  # queue sentinel: end the outgoing half of the stream
_MAX_QUEUED = 50_000  # a stream this far behind is not reading: stop queueing to it


class DecisionLog:
    """Writes decision records to the sink, with the delivery latency when acked.

    A sink that raises never breaks the guard: the record is dropped and counted in
    ``stats["decisions_dropped"]`` (the registry's counters: ``GuardAdmin.Stats`` and the
    ``otel_guard.decisions.dropped`` metric). A burst of failures logs twice, not once per
    record: an error when the first record is dropped, a warning with the count when a write
    succeeds again.
    """

    def __init__(self, sink: Any, guard_id: str, stats: dict[str, int] | None = None) -> None:
        self.sink = sink
        self.guard_id = guard_id
        self.latencies_ms: deque[float] = deque(maxlen=4096)  # recent, for ListRuns/benchmarks
        self.written = 0
        self.stats = {} if stats is None else stats
        self.stats.setdefault("decisions_dropped", 0)
        self._burst = 0  # records dropped since the sink last took one
        # Called with each record as it is written (the guard's metrics count decisions here).
        self.on_write: Callable[[DecisionRecord, float | None], None] | None = None

    def write(self, record: DecisionRecord, latency_ms: float | None) -> None:
        record.delivery_latency_ms = latency_ms
        record.guard_id = self.guard_id
        if latency_ms is not None:
            self.latencies_ms.append(latency_ms)
        self.written += 1
        try:
            self.sink.write_decision(record)
        except Exception:  # the sink's failure must not end the stream or the ingest call
            self._dropped(record)
        else:
            if self._burst:
                log.warning(
                    "decision sink accepts records again; %d decision record(s) were dropped",
                    self._burst,
                )
                self._burst = 0
        if self.on_write is not None:
            self.on_write(record, latency_ms)

    def _dropped(self, record: DecisionRecord) -> None:
        self.stats["decisions_dropped"] += 1
        self._burst += 1
        if self._burst == 1:
            log.error(
                "decision sink failed; dropping decision records until it recovers "
                "(first: run %.80r, action %s)",
                record.run_id,
                record.action,
                exc_info=True,
            )


class Outbox:
    """A session's outgoing messages, for its one writer (the Attach handler): the part of
    ``asyncio.Queue`` it uses (``put_nowait``, ``get``, ``get_nowait``, ``empty``,
    ``qsize``/``len``) on a deque, woken by one future. Several commands go out per run, and
    ``asyncio.Queue`` spends a few Python calls on each (its task counter, its events); here a
    put is an append and, when the writer waits, one ``set_result``."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def get(self) -> Any:
        """The next message, waiting for one (one waiter at a time: the writer)."""
        items = self._items
        while not items:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                if self._waiter is waiter:
                    self._waiter = None
        return items.popleft()

    def get_nowait(self) -> Any:
        if not self._items:
            raise asyncio.QueueEmpty
        return self._items.popleft()

    def empty(self) -> bool:
        return not self._items

    def qsize(self) -> int:
        return len(self._items)

    def __len__(self) -> int:
        return len(self._items)


class AgentSession:
    """One agent process attached over ``GuardControl.Attach``.

    ``clock``: the registry's clock. A command's send time, its delivery latency and the
    sweep's expiry of unacked commands are all read from it, so the sweep compares times of
    one clock (an expiry on another clock than the send time's would depend on the host's
    uptime)."""

    def __init__(
        self,
        session_id: str,
        principal_tenant: str | None,
        log: DecisionLog,
        clock: Callable[[], float],
    ) -> None:
        self.session_id = session_id
        self.clock = clock
        self.principal_tenant = principal_tenant  # None = admin / no auth
        self.process_id = ""
        self.host = ""
        self.pid = 0
        self.tenant = ""
        self.log = log
        self.queue = Outbox()
        self.runs: OrderedSet[str] = OrderedSet()  # in registration order
        self.closed = False
        self.error: Exception | None = None  # why the stream must end, if it must
        self.clock_skew_s: float | None = None  # agent clock minus guard clock (the Hello)
        self.messages_rejected = 0  # messages of this stream refused on their own
        self._next_id = 0
        # command_id -> (send time on self.clock, record)
        self.pending: dict[int, tuple[float, DecisionRecord]] = {}

    def compose(self, field: str) -> tuple[Any, Any]:
        """A GuardMessage with the next command id, and its ``field`` body (set, empty) to
        fill in place: :meth:`post` then queues it. Building the body inside its envelope
        spares a copy of it per command (an Admit, an Allowance and a RecordAck per run)."""
        self._next_id += 1
        msg = envelope_to_pb(self._next_id, time.time())
        body = getattr(msg, field)
        body.SetInParent()
        return msg, body

    def post(self, msg: Any, record: DecisionRecord | None = None) -> int:
        r"""Queue a :meth:`compose`\ d message; returns its command id. ``record``: the
        decision it delivers, written when the agent acks it (at once, without a latency,
        when the stream is closed or not reading)."""
        cid = msg.command_id
        if record is not None:
            record.command_id = cid
        if self.closed or len(self.queue) >= _MAX_QUEUED:
            if record is not None:
                self.log.write(record, None)
            return cid
        if record is not None:
            self.pending[cid] = (self.clock(), record)
        self.queue.put_nowait(msg)
        return cid

    def send(self, field: str, body: Any, record: DecisionRecord | None = None) -> int:
        """Queue one GuardMessage with ``body`` in oneof ``field``; returns its command id."""
        msg, inner = self.compose(field)
        inner.CopyFrom(body)
        return self.post(msg, record)

    def push(self, record: DecisionRecord, *, request_id: int = 0) -> int:
        """Deliver a recorded decision: a ``record.action`` directive (warn, wrap_up, cancel or
        deny) with its reason, detail, utilisation and metric. The record is written when the
        agent acks it, or without a latency when it never does. Returns the command id."""
        return self._directive(
            record.action,
            record.run_id,
            record.reason,
            record.detail,
            record.utilisation,
            record.metric,
            record,
            request_id,
        )

    def cancel(self, run_id: str, reason: str, detail: str) -> int:
        """Send again a cancel that is already recorded (to an agent that re-attached, or
        that re-registers a run the guard ended while it was away): no new record."""
        return self._directive("cancel", run_id, reason, detail, None, None, None, 0)

    def _directive(
        self,
        field: str,
        run_id: str,
        reason: str,
        detail: str,
        utilisation: float | None,
        metric: str | None,
        record: DecisionRecord | None,
        request_id: int,
    ) -> int:
        body = directive_to_pb(run_id, reason, detail, utilisation, metric, request_id)
        return self.send(field, body, record)

    def ack(self, command_id: int) -> float | None:
        """Record an ack; returns the delivery latency in ms when it closed a decision."""
        entry = self.pending.pop(command_id, None)
        if entry is None:
            return None
        sent, record = entry
        latency_ms = (self.clock() - sent) * 1000.0
        self.log.write(record, latency_ms)
        return latency_ms

    def expire(self, now: float, *, all_pending: bool = False) -> int:
        """Write decisions never acked within ACK_TIMEOUT_S (or all, on close)."""
        if not self.pending:
            return 0
        late = [
            cid
            for cid, (sent, _) in self.pending.items()
            if all_pending or now - sent > ACK_TIMEOUT_S
        ]
        for cid in late:
            _, record = self.pending.pop(cid)
            self.log.write(record, None)
        return len(late)

    def close(self) -> None:
        """End the outgoing stream and flush pending decisions without latency."""
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(_CLOSE)
        self.expire(self.clock(), all_pending=True)

    @staticmethod
    def is_close(item: Any) -> bool:
        return item is _CLOSE
