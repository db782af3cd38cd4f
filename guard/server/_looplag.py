"""Event-loop lag: how late the server's loop runs a task that asked to wake up on time.

A monitor task sleeps :data:`TICK_S` and measures how much later than asked it woke up: that
overshoot is how long something else held the loop (a large message, a slow handler), which
is also how long every cancel and health check waited. Kept as the maximum since the start
and the last :data:`RECENT` samples (about 20 s), for percentiles. Read through
``GuardAdmin.Stats`` (``loop_lag_*_ms`` figures).
"""

from __future__ import annotations

import asyncio
import time
from array import array

__all__ = ["RECENT", "TICK_S", "LoopLag"]

TICK_S = 0.010
RECENT = 2048


class LoopLag:
    """Samples the running loop's scheduling lag; ``figures()`` summarises them in ms."""

    def __init__(self, tick_s: float = TICK_S, recent: int = RECENT) -> None:
        self.tick_s = float(tick_s)
        self.max_ms = 0.0
        self.samples = 0
        self._recent = array("d", bytes(8 * recent))
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        clock = time.perf_counter
        tick = self.tick_s
        recent = self._recent
        while True:
            before = clock()
            await asyncio.sleep(tick)
            lag_ms = max(0.0, (clock() - before - tick) * 1000.0)
            recent[self.samples % len(recent)] = lag_ms
            self.samples += 1
            if lag_ms > self.max_ms:
                self.max_ms = lag_ms

    def figures(self) -> dict[str, float]:
        """``loop_lag_{max,recent_max,p50,p99}_ms`` and ``loop_lag_samples``."""
        n = min(self.samples, len(self._recent))
        window = sorted(self._recent[:n])

        def pct(q: float) -> float:
            return window[min(n - 1, int(q * n))] if n else 0.0

        return {
            "loop_lag_max_ms": self.max_ms,
            "loop_lag_recent_max_ms": window[-1] if n else 0.0,
            "loop_lag_p50_ms": pct(0.50),
            "loop_lag_p99_ms": pct(0.99),
            "loop_lag_samples": float(self.samples),
        }
