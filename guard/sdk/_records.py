"""Termination records not yet acknowledged by the guard (exactly-once delivery, SDK half).

Every ``RunEnded`` the control client sends stays here, keyed by run id, until the guard's
``RecordAck`` for that run arrives (the guard acks once the record is in its WAL, and acks a
repeat without changing anything). After each reconnect every record still here is sent
again, right after the Hello. ``guard.shutdown()`` waits, bounded, for this to empty. The
run ids acknowledged recently go in the Hello (``ended_runs``), so a restarted guard knows
those runs are over when the span exporter retries their spans.

A record the guard refuses (``Reject``: out of its input bounds) is forgotten at once with a
warning naming the run and the reason: resending it could only be refused again.

Bounded: at :data:`MAX_UNACKED` records the oldest are kept (they have waited longest for a
guard) and a new one is refused with a warning naming it: counted, never silent.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from typing import Any

__all__ = ["MAX_UNACKED", "PendingRecords"]

log = logging.getLogger("guard.sdk.control")
MAX_UNACKED = 10_000
ACKED_RECENT_MAX = 1024  # acknowledged run ids a Hello tells a (restarted) guard about
ACKED_RECENT_S = 120.0  # ... if acknowledged this recently (the exporter's retries are older)


class PendingRecords:
    """Thread-safe: agent threads add, the control thread acks and resends."""

    def __init__(self, cap: int = MAX_UNACKED) -> None:
        self._cap = cap
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._acked: deque[tuple[float, str]] = deque(maxlen=ACKED_RECENT_MAX)
        self._cond = threading.Condition()
        self.refused = 0

    def add(self, run_id: str, msg: Any) -> bool:
        """Keep ``msg`` (an AgentMessage with ``run_ended``) until acked; False when full."""
        with self._cond:
            if run_id in self._items or len(self._items) < self._cap:
                self._items[run_id] = msg
                return True
            self.refused += 1
            refused = self.refused
        if refused == 1 or refused % 1000 == 0:  # a flood of these is one line per 1000
            log.warning(
                "otel-guard: %d unacknowledged termination records held (max %d); the record "
                "of run %s is NOT kept for resending (%d refused so far)",
                self._cap,
                self._cap,
                run_id,
                refused,
            )
        return False

    def ack(self, run_id: str) -> bool:
        """The guard holds ``run_id``'s record durably: forget it. False if not held."""
        with self._cond:
            found = self._items.pop(run_id, None) is not None
            if found:
                self._acked.append((time.monotonic(), run_id))
            if not self._items:
                self._cond.notify_all()
            return found

    def reject(self, run_id: str, reason: str, code: int) -> bool:
        """The guard refused ``run_id``'s record for good (a ``Reject``): forget it, never
        resend it (it would be refused again after every reconnect), and say so in one
        WARNING line. False if not held (e.g. a second Reject of a record resent meanwhile)."""
        with self._cond:
            found = self._items.pop(run_id, None) is not None
            if not self._items:
                self._cond.notify_all()
        if found:
            log.warning(
                "otel-guard: the guard refused the termination record of run %s (status %d: "
                "%s); it is not sent again",
                run_id,
                code,
                reason,
            )
        return found

    def all(self) -> list[Any]:
        """Every record still unacknowledged, oldest first (what a reconnect resends)."""
        with self._cond:
            return list(self._items.values())

    def acked_recently(self) -> list[str]:
        """Run ids acknowledged within :data:`ACKED_RECENT_S` (at most the last 1024): the
        Hello's ``ended_runs``."""
        cutoff = time.monotonic() - ACKED_RECENT_S
        with self._cond:
            return [rid for t, rid in self._acked if t >= cutoff]

    def run_ids(self) -> list[str]:
        with self._cond:
            return list(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def wait_empty(self, timeout_s: float) -> bool:
        """Block until every record is acknowledged or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._items:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True
