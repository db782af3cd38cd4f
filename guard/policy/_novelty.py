"""Progress derived from tool results, for runs whose code reports none.

Frameworks run with ``guard.instrument()`` alone give the stagnation detector no signal: no
``progress`` flag and no facts. What they do give is every tool result's hash, and a result
the run has not seen before is new information. :class:`ResultNovelty` turns that into a
step's progress flag:

* ``True``  when a tool result of the step is new to the run;
* ``False`` when the step had tool results and every one had been seen before (errors count
  as results: the same error again is no new information);
* ``None``  when the step had no tool results (no calls, or calls that reported none): no
  information is not evidence of a loop.

Calls of declared polls (:mod:`guard.policy._polls`) are left out: a step that only polled
is neither progress nor a stale step (``acted`` is ``False`` for it), since waiting for a job
is judged by the poll rule alone.

Memory is bounded: the last ``capacity`` *distinct* results as 64-bit ints, in a ring (their
order) and a set (the per-call lookup, about half a microsecond, where a scan of the ring costs
two to three times that); about 11 KB once full at the default 64. A result older than that
counts as new again, which errs towards progress (never a false stop): stagnation cycling
among up to 64 answers is caught. A fan-out over many items returning distinct rows is progress
at every step; only steps that return nothing but results already seen are stale, so the
policy's ``no_progress_steps`` of them in a row stop the run (``no_state_change``).

Pure: no I/O and no clock. Not thread-safe: one caller per run (the SDK holds the run's lock).
"""

from __future__ import annotations

from array import array

from guard.errors import ConfigError
from guard.policy._fingerprint import hash64

__all__ = ["DEFAULT_NOVELTY_CAPACITY", "ResultNovelty"]

# Distinct results remembered per run: three times the default loop window. Per run in the
# SDK only (the guard reads the derived flag from the step span), so a few KB each.
DEFAULT_NOVELTY_CAPACITY = 64


class ResultNovelty:
    """Per-run memory of tool results and the progress flag each step earns from them."""

    __slots__ = ("_calls", "_known", "_n", "_new", "_polls", "_results", "_ring")

    def __init__(self, capacity: int = DEFAULT_NOVELTY_CAPACITY) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ConfigError(f"must be an integer >= 1, got {capacity!r}", path="capacity")
        self._ring = array("Q", bytes(8 * capacity))
        self._known: set[int] = set()  # the ring's results, for the lookup
        self._n = 0  # distinct results written so far (the ring's next slot is _n % capacity)
        # The current step (since the previous end_step): calls, results, whether one was new,
        # and poll calls.
        self._calls = self._results = self._polls = 0
        self._new = False

    @property
    def capacity(self) -> int:
        return len(self._ring)

    def observe(self, result: str | None) -> bool:
        """One tool call (not a poll) and its result hash, in order; ``True`` when the result
        is new to the run. ``None`` (no result reported) is a call without information."""
        self._calls += 1
        h = hash64(result)
        if not h:
            return False
        self._results += 1
        known = self._known
        if h in known:
            return False
        ring = self._ring
        i = self._n % len(ring)
        if self._n >= len(ring):
            known.discard(ring[i])  # the oldest result makes room
        ring[i] = h
        known.add(h)
        self._n += 1
        self._new = True
        return True

    def note_poll(self) -> None:
        """One call of a declared poll (its result is the poll rule's to judge)."""
        self._polls += 1

    def end_step(self) -> tuple[bool | None, bool]:
        """The step ended: ``(progress, only_polled)`` of its calls, and the next step begins.

        ``progress``: ``True`` (a new result), ``False`` (results, none new) or ``None`` (no
        results). ``only_polled``: the step's calls were all polls (it is then neither progress
        nor stale, whatever its results).
        """
        calls, results, new, polls = self._calls, self._results, self._new, self._polls
        self._calls = self._results = self._polls = 0
        self._new = False
        if not calls:
            return None, polls > 0
        if not results:
            return None, False
        return new, False

    def nbytes(self) -> int:
        """Approximate memory held (object, ring, set and its ints)."""
        import sys

        known = self._known
        ints = sum(sys.getsizeof(h) for h in known)
        return sys.getsizeof(self) + sys.getsizeof(self._ring) + sys.getsizeof(known) + ints

    def reset(self) -> None:
        """Forget every result (e.g. after an operator resumed a run with new instructions)."""
        self._ring = array("Q", bytes(8 * len(self._ring)))
        self._known.clear()
        self._n = self._calls = self._results = self._polls = 0
        self._new = False
