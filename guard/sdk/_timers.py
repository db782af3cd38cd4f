"""One shared timer thread for run deadlines and SIGKILL escalation.

A thread per run would be wasteful with thousands of runs; a heap and one daemon thread
serve them all. Callbacks must be quick and must not raise (errors are logged).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

__all__ = ["Timer", "schedule"]

log = logging.getLogger("guard.sdk")


class Timer:
    """Handle of a scheduled callback; :meth:`cancel` is idempotent and thread-safe."""

    __slots__ = ("_owner", "cancelled", "fn", "when")

    def __init__(self, when: float, fn: Callable[[], None], owner: _Scheduler) -> None:
        self.when = when
        self.fn = fn
        self.cancelled = False
        self._owner = owner

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self._owner.cancelled += 1


class _Scheduler:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self.cancelled = 0  # cancelled timers still in the heap (approximate)

    def schedule(self, delay_s: float, fn: Callable[[], None]) -> Timer:
        timer = Timer(time.monotonic() + max(0.0, delay_s), fn, self)
        with self._cond:
            if len(self._heap) > 1024 and self.cancelled > len(self._heap) // 2:
                # Runs end long before their deadlines: drop their dead timers in one pass
                # so the heap stays proportional to the live runs.
                self._heap = [e for e in self._heap if not e[2].cancelled]
                heapq.heapify(self._heap)
                self.cancelled = 0
            heapq.heappush(self._heap, (timer.when, next(self._seq), timer))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="otel-guard-timers", daemon=True
                )
                self._thread.start()
            self._cond.notify()
        return timer

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    while self._heap and self._heap[0][2].cancelled:
                        heapq.heappop(self._heap)
                        self.cancelled = max(0, self.cancelled - 1)
                    if not self._heap:
                        self._cond.wait()
                        continue
                    wait = self._heap[0][0] - time.monotonic()
                    if wait <= 0:
                        timer = heapq.heappop(self._heap)[2]
                        break
                    self._cond.wait(wait)
            if timer.cancelled:
                continue
            try:
                timer.fn()
            except Exception:
                log.exception("otel-guard timer callback failed")


_scheduler = _Scheduler()


def schedule(delay_s: float, fn: Callable[[], None]) -> Timer:
    """Run ``fn`` on the shared timer thread after ``delay_s`` seconds."""
    return _scheduler.schedule(delay_s, fn)
