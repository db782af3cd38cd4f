"""The SDK's clock: one injectable monotonic clock for run deadlines and pauses.

``guard.configure(clock=...)`` sets it (default: :data:`SYSTEM_CLOCK`, ``time.monotonic`` and
the shared timer thread of :mod:`guard.sdk._timers`). A run reads its elapsed time (budget,
deadline, paused time) from it and arms its deadline timer on it, so a test can move time
with a :class:`ManualClock` instead of sleeping through a deadline.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from guard.sdk import _timers

__all__ = ["SYSTEM_CLOCK", "Clock", "ManualClock", "SystemClock", "is_clock"]

log = logging.getLogger("guard.sdk")


class Clock(Protocol):
    """What the SDK needs of a clock."""

    def monotonic(self) -> float:
        """Seconds on a monotonic scale (only differences matter)."""
        ...

    def schedule(self, delay_s: float, fn: Callable[[], None]) -> Any:
        """Call ``fn()`` once ``delay_s`` seconds have passed on this clock; returns a handle
        whose ``cancel()`` is idempotent and thread-safe. ``fn`` must be quick."""
        ...


class SystemClock:
    """Real time: ``time.monotonic`` and the SDK's one timer thread."""

    __slots__ = ()

    monotonic = staticmethod(time.monotonic)
    schedule = staticmethod(_timers.schedule)


SYSTEM_CLOCK = SystemClock()


def is_clock(value: Any) -> bool:
    """Whether ``value`` has the two methods of a :class:`Clock` (checked by ``configure``)."""
    return callable(getattr(value, "monotonic", None)) and callable(
        getattr(value, "schedule", None)
    )


class _Handle:
    __slots__ = ("cancelled", "fn", "when")

    def __init__(self, when: float, fn: Callable[[], None]) -> None:
        self.when = when
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock for tests: time moves only by :meth:`advance`, which fires the timers that fall
    due, in time order, in the advancing thread (so their effects are visible on return)."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self._now = float(start_s)
        self._heap: list[tuple[float, int, _Handle]] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        return self._now

    def schedule(self, delay_s: float, fn: Callable[[], None]) -> _Handle:
        with self._lock:
            h = _Handle(self._now + max(0.0, delay_s), fn)
            heapq.heappush(self._heap, (h.when, next(self._seq), h))
        return h

    def pending(self) -> int:
        """Timers scheduled and neither fired nor cancelled."""
        with self._lock:
            return sum(1 for _, _, h in self._heap if not h.cancelled)

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, firing every timer due on the way."""
        if seconds < 0:
            raise ValueError(f"a monotonic clock does not go back (seconds={seconds:g})")
        with self._lock:
            target = self._now + seconds
        while True:
            with self._lock:
                if not self._heap or self._heap[0][0] > target:
                    self._now = target
                    return
                when, _, h = heapq.heappop(self._heap)
                self._now = max(self._now, when)
            if not h.cancelled:
                try:
                    h.fn()  # may schedule again (a re-armed deadline): seen in this loop
                except Exception:
                    log.exception("otel-guard timer callback failed")
