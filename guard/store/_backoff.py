"""The store's one retry schedule: exponential with full jitter.

Both the ClickHouse writer (an insert failed) and the data-dir probe (the disk is full) back off
with it, so that the replicas of a fleet that lose one ClickHouse, or share one full volume, do
not retry in step.
"""

from __future__ import annotations

import random
import time

__all__ = ["Backoff"]


class Backoff:
    """Doubles from ``min_s`` to ``max_s`` on each :meth:`failed`; the wait actually scheduled is
    that step times a uniform 0.5-1 (half jitter keeps a floor, so a flapping peer is not
    hammered). :meth:`reset` after a success."""

    __slots__ = ("_step_s", "due_at", "max_s", "min_s")

    def __init__(self, *, min_s: float, max_s: float) -> None:
        self.min_s = min_s
        self.max_s = max_s
        self._step_s = 0.0
        self.due_at = 0.0  # monotonic time of the next retry; 0 = now

    def failed(self) -> float:
        """Schedule the next retry; returns the wait in seconds."""
        self._step_s = min(self.max_s, max(self.min_s, self._step_s * 2))
        wait_s = self._step_s * random.uniform(0.5, 1.0)
        self.due_at = time.monotonic() + wait_s
        return wait_s

    def reset(self) -> None:
        """A success: the next failure starts again at ``min_s``."""
        self._step_s = 0.0

    def retry_now(self) -> None:
        """Make the next retry due at once, keeping the step (flush and close replay now)."""
        self.due_at = 0.0

    def due(self) -> bool:
        return time.monotonic() >= self.due_at
