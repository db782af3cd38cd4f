"""Event-loop lag: how late the server's loop runs a task that asked to wake up on time.

A monitor task sleeps :data:`TICK_S` and measures how much later than asked it woke up: that
overshoot is how long something else held the loop (a large message, a slow handler), which
is also how long every cancel and health check waited. Kept as the maximum since the start
and the last :data:`RECENT` samples (about 20 s), for percentiles. Read through
``GuardAdmin.Stats`` (``loop_lag_*_ms`` figures).

On a shared machine the wall-clock lag also counts time the process was not scheduled at
all. ``loop_busy_*_ms`` separates the two: per tick, the part of the lag during which the
loop's thread was actually running (its CPU time, ``time.thread_time``), i.e. work that
held the loop.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import Callable

__all__ = ["RECENT", "TICK_S", "LoopLag"]

TICK_S = 0.010
RECENT = 2048


class LoopLag:
    """Samples the running loop's scheduling lag; ``figures()`` summarises them in ms."""

    def __init__(self, tick_s: float = TICK_S, recent: int = RECENT) -> None:
        self.tick_s = float(tick_s)
        self.max_ms = 0.0
        self.busy_max_ms = 0.0
        self.samples = 0
        self._recent = array("d", bytes(8 * recent))
        self._busy = array("d", bytes(8 * recent))
        self._task: asyncio.Task[None] | None = None
        self.on_sample: Callable[[float], None] | None = None  # each lag in ms (metrics)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        clock = time.perf_counter
        cpu = time.thread_time
        tick = self.tick_s
        recent, busy = self._recent, self._busy
        while True:
            before, cpu_before = clock(), cpu()
            await asyncio.sleep(tick)
            lag_ms = max(0.0, (clock() - before - tick) * 1000.0)
            busy_ms = min(lag_ms, (cpu() - cpu_before) * 1000.0)
            i = self.samples % len(recent)
            recent[i], busy[i] = lag_ms, busy_ms
            self.samples += 1
            self.max_ms = max(self.max_ms, lag_ms)
            self.busy_max_ms = max(self.busy_max_ms, busy_ms)
            if self.on_sample is not None:
                self.on_sample(lag_ms)

    def figures(self) -> dict[str, float]:
        """``loop_{lag,busy}_{max,recent_max,p50,p99}_ms`` and ``loop_lag_samples``."""
        n = min(self.samples, len(self._recent))
        out = {"loop_lag_samples": float(self.samples)}
        for name, values, top in (
            ("lag", self._recent, self.max_ms),
            ("busy", self._busy, self.busy_max_ms),
        ):
            window = sorted(values[:n])
            out[f"loop_{name}_max_ms"] = top
            out[f"loop_{name}_recent_max_ms"] = window[-1] if n else 0.0
            out[f"loop_{name}_p50_ms"] = window[n // 2] if n else 0.0
            out[f"loop_{name}_p99_ms"] = window[min(n - 1, int(0.99 * n))] if n else 0.0
        return out
