"""The bucketed sliding-window sum under every tenant budget (:class:`RollingWindow`).

Semantics (exact, and what the property test checks):

* time is cut into buckets of width ``w = window_s / buckets``; an instant ``t`` belongs to
  bucket ``floor(t / w)``;
* ``total(now)`` is the sum of every value added at a time ``t`` whose bucket is one of the
  ``buckets`` most recent ones, i.e. ``floor(now/w) - floor(t/w) < buckets``. So the window
  covers between ``window_s - w`` and ``window_s`` seconds of history: it is the true sliding
  sum over ``(now - window_s, now]`` rounded to bucket granularity;
* time is monotonic: a ``now`` earlier than the latest seen is treated as the latest; a value
  added with an old ``t`` lands in its own bucket if that bucket is still in the window, and is
  dropped otherwise (it has already expired).

Memory is ``buckets`` floats and ints; ``add`` and ``total`` evict the buckets that slid out, at
most ``buckets`` of them, and each bucket is evicted once per window, so both are O(1)
amortised.
"""

from __future__ import annotations

import math
from array import array

from guard.errors import InvalidInput

__all__ = ["WINDOW_CAP", "RollingWindow"]

WINDOW_CAP = 1e300  # a window's buckets and total saturate here, never reach inf


def _saturate(x: float) -> float:
    return x if -WINDOW_CAP <= x <= WINDOW_CAP else math.copysign(WINDOW_CAP, x)


class RollingWindow:
    """A bucketed sliding-window sum (see the module docstring for the exact semantics)."""

    __slots__ = ("_head", "_ids", "_sums", "_total", "buckets", "width_s", "window_s")

    def __init__(self, window_s: float, *, buckets: int = 60) -> None:
        if not (isinstance(window_s, int | float) and math.isfinite(window_s) and window_s > 0):
            raise InvalidInput(f"window_s must be a finite number > 0, got {window_s!r}")
        if not isinstance(buckets, int) or buckets < 1:
            raise InvalidInput(f"buckets must be an int >= 1, got {buckets!r}")
        self.window_s = float(window_s)
        self.buckets = buckets
        self.width_s = self.window_s / buckets
        self._sums = array("d", bytes(8 * buckets))
        self._ids = array("q", [-(2**62)] * buckets)  # bucket id held by each slot
        self._head: int | None = None  # newest bucket id seen
        self._total = 0.0

    def _bucket(self, t: float) -> int:
        return math.floor(t / self.width_s)

    def _advance(self, now: float) -> int:
        b = self._bucket(now)
        if self._head is None:
            self._head = b
            return b
        if b <= self._head:
            return self._head
        oldest_live = b - self.buckets + 1
        if b - self._head >= self.buckets:
            for i in range(self.buckets):
                self._sums[i] = 0.0
            self._total = 0.0
        else:
            for k in range(self._head + 1, b + 1):
                slot = k % self.buckets
                if self._ids[slot] < oldest_live:
                    self._total -= self._sums[slot]
                    self._sums[slot] = 0.0
        self._head = b
        if abs(self._total) < 1e-9:
            # Float subtraction drift: when every bucket is empty the sum is exactly zero.
            self._total = math.fsum(self._sums)
        return b

    def add(self, now: float, value: float) -> None:
        """Add ``value`` at time ``now`` (values may be negative, e.g. to undo a charge)."""
        if not math.isfinite(value):
            raise InvalidInput(f"rolling window value must be finite, got {value!r}")
        b = math.floor(now / self.width_s)  # self._bucket(now), inline: once per admission
        head = self._head
        if head is None or b > head:
            head = self._advance(now)
        if head < b:  # min(b, head)
            b = head
        if head - b >= self.buckets:
            return  # already outside the window
        slot = b % self.buckets
        if self._ids[slot] != b:
            self._total -= self._sums[slot]
            self._sums[slot] = 0.0
            self._ids[slot] = b
        # A sum of finite values can still overflow to inf (which would stop a tenant
        # forever and poison every later sum): bucket and total saturate at WINDOW_CAP, far
        # above any limit, so the window still reads "over its limit" and stays finite.
        new = self._sums[slot] + value
        if -WINDOW_CAP <= new <= WINDOW_CAP and -WINDOW_CAP <= self._total + value <= WINDOW_CAP:
            self._sums[slot] = new
            self._total += value
        else:
            self._sums[slot] = _saturate(new)
            self._total = _saturate(math.fsum(self._sums))

    def total(self, now: float) -> float:
        """Sum of the values in the window ending at ``now``."""
        head = self._head
        # ``now`` in the newest bucket seen (or earlier): nothing slid out, nothing to do
        if head is None or math.floor(now / self.width_s) > head:
            self._advance(now)
        return self._total
