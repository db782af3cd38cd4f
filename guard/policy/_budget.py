"""The per-run budget: counters, reservations, the deadline clock, pause and resume.

One lock per budget *tree*: a nested run's budget shares its root's lock, so recording into a
child and all of its ancestors, or checking a reservation against the whole chain, is one
atomic step. That is what keeps 32 threads reserving at once from overselling.

The lineage (this budget's ancestors) is fixed at construction and kept as tuples, so
recording walks no parent chain. Reservations are in ``_reservation.py``, the record-then-
decide paths in ``_escalation.py``, snapshots and restores in ``_restore.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from guard.policy._decide import decide as _decide
from guard.policy._decide import utilisation as _utilisation
from guard.policy._escalation import Escalations, triggers
from guard.policy._reservation import Reservation, Reserving, plain_counts, plain_money
from guard.policy._reservation import check_count as _count
from guard.policy._reservation import check_model_call as _model_call
from guard.policy._reservation import check_money as _money
from guard.policy._restore import Restorable
from guard.policy._types import Decision, Limits, Phase, Reason, Usage

if TYPE_CHECKING:  # pragma: no cover
    from guard.policy._loops import LoopVerdict

__all__ = ["Budget", "Remaining", "Reservation"]


@dataclass(frozen=True, slots=True)
class Remaining:
    """What is left of a run's working budget. ``None`` = unlimited; never negative.

    Net of outstanding reservations and of the final-answer reserve (tokens and seconds).
    """

    seconds: float | None = None
    steps: int | None = None
    tokens: int | None = None
    cost_usd: float | None = None
    tool_calls: int | None = None
    model_calls: int | None = None


class Budget(Escalations, Reserving, Restorable):
    """Thread-safe per-run budget (one lock shared by the whole parent chain).

    ``clock`` is a monotonic clock in seconds (injected for tests). A ``parent`` budget (the
    run that started this nested run) sees every usage recorded here, and reservations are
    checked against it too.
    """

    # Slots: the guard keeps one Budget per live run (memory goal <= 4 KB per run in total).
    __slots__ = (
        "_ancestors",
        "_clock",
        "_limits",
        "_lock",
        "_paused_at",
        "_paused_total",
        "_reservations",
        "_reserved",
        "_seq",
        "_started",
        "_trig",
        "_usage",
        "_usages",
    )

    def __init__(
        self,
        limits: Limits,
        *,
        clock: Callable[[], float] = time.monotonic,
        parent: Budget | None = None,
    ) -> None:
        self._limits = limits
        self._clock = clock
        self._lock: threading.Lock = parent._lock if parent is not None else threading.Lock()
        self._usage = Usage()
        # The lineage, computed once: the ancestors (parent first), and the usage counters a
        # record adds to (this budget's, then its ancestors'). No tuple holds the budget
        # itself: a budget must stay free of reference cycles, since the guard frees ended
        # runs by reference counting alone (server/_gc.py freezes what the collector saw).
        self._ancestors: tuple[Budget, ...] = () if parent is None else (parent, *parent._ancestors)
        self._usages: tuple[Usage, ...] = (self._usage, *(b._usage for b in self._ancestors))
        # Counted records of *this* budget (not its nested runs'), numbered under the lock:
        # the SDK puts the number on the span (``guard.seq``) so a restarted guard can tell
        # which spans a re-registration snapshot already holds (see ``snapshot``).
        self._seq = 0
        self._reserved = Usage()
        self._reservations: list[Reservation] = []
        self._started = clock()
        self._paused_at: float | None = None
        self._paused_total = 0.0
        # This budget's trigger points (see _escalation.py) for a run told nothing yet, set
        # now (a cache lookup) so that the first check of a new run needs no recomputation.
        self._trig = triggers(limits, 0)

    # -- limits and usage ---------------------------------------------------------------
    @property
    def limits(self) -> Limits:
        return self._limits

    @property
    def parent(self) -> Budget | None:
        return self._ancestors[0] if self._ancestors else None

    def set_limits(self, limits: Limits) -> None:
        """Replace the limits (the caller passes already-tightened limits)."""
        with self._lock:
            self._limits = limits

    def usage(self) -> Usage:
        with self._lock:
            return self._usage.copy()

    def reserved(self) -> Usage:
        """Outstanding (unsettled) reservations, as a usage snapshot."""
        with self._lock:
            return self._reserved.copy()

    def _lineage(self) -> tuple[Budget, ...]:
        """This budget and its ancestors (for the paths that touch more than the counters)."""
        return (self, *self._ancestors)

    def record_step(self) -> int:
        """One step; returns its record number (:attr:`seq`)."""
        with self._lock:
            for u in self._usages:
                u.steps += 1
            self._seq += 1
            return self._seq

    def record_model_call(
        self,
        *,
        input_tokens: int = 0,
        output_tokens: int = 0,
        reasoning_tokens: int = 0,
        cached_tokens: int = 0,
        cost_usd: float | None = None,
    ) -> int:
        """One model call. ``input_tokens`` include cached, ``output_tokens`` reasoning.
        Returns its record number."""
        # Hot path (every model span the guard ingests): plain non-negative ints and a plain
        # cost pass on one exact type test; anything else gets the full check (and its error
        # message).
        cost = cost_usd
        if not plain_counts(input_tokens, output_tokens, reasoning_tokens, cached_tokens) or (
            cost is not None and not plain_money(cost)
        ):
            cost = _model_call(
                input_tokens, output_tokens, reasoning_tokens, cached_tokens, cost_usd
            )
        with self._lock:
            self._add_model_call_locked(
                input_tokens, output_tokens, reasoning_tokens, cached_tokens, cost
            )
            return self._seq

    def _add_model_call_locked(
        self, input_tokens: int, output_tokens: int, reasoning: int, cached: int, cost: float | None
    ) -> None:
        """Apply validated model-call usage to the whole chain (hot path: plain field
        increments, no temporary Usage objects) and number it. Caller holds the lock."""
        self._seq += 1
        for u in self._usages:
            u.model_calls += 1
            u.input_tokens += input_tokens
            u.output_tokens += output_tokens
            u.reasoning_tokens += reasoning
            u.cached_tokens += cached
            if cost is not None:
                u.cost_usd = (u.cost_usd or 0.0) + cost

    def record_tool_calls(
        self, n: int = 1, *, attempts: int | None = None, cost_usd: float | None = None
    ) -> int:
        """``n`` tool calls; ``attempts`` counts retries too (defaults to ``n``). Returns the
        record number (one per call of this method)."""
        if type(n) is not int or n < 0:
            n = _count("tool_calls", n)
        if attempts is None:
            attempts = n
        elif type(attempts) is not int or attempts < 0:
            attempts = _count("attempts", attempts)
        cost = None if cost_usd is None else _money("cost_usd", cost_usd)
        with self._lock:
            for u in self._usages:
                u.tool_calls += n
                u.tool_attempts += attempts
                if cost is not None:
                    u.cost_usd = (u.cost_usd or 0.0) + cost
            self._seq += 1
            return self._seq

    # -- time -----------------------------------------------------------------------------
    def elapsed_s(self) -> float:
        """Seconds since start; paused time excluded when ``pause_freezes_deadline``."""
        with self._lock:
            return self._elapsed_locked()

    def _elapsed_locked(self) -> float:
        now = self._clock()
        if not self._limits.pause_freezes_deadline:
            return max(0.0, now - self._started)
        paused = self._paused_total
        if self._paused_at is not None:
            paused += now - self._paused_at
        return max(0.0, now - self._started - paused)

    def pause(self) -> None:
        """Pause for approval: not a stop. Idempotent."""
        with self._lock:
            if self._paused_at is None:
                self._paused_at = self._clock()

    def resume(self) -> None:
        with self._lock:
            if self._paused_at is not None:
                self._paused_total += self._clock() - self._paused_at
                self._paused_at = None

    @property
    def paused(self) -> bool:
        return self._paused_at is not None

    # -- derived ----------------------------------------------------------------------------
    def remaining(self) -> Remaining:
        with self._lock:
            lim, u, r = self._limits, self._usage, self._reserved
            elapsed = self._elapsed_locked()

            def left(limit: float | None, used: float, hold: float = 0) -> float | None:
                return None if limit is None else max(0, limit - used - hold)

            secs = left(lim.deadline_s, elapsed, lim.reserve_s or 0.0)
            toks = left(lim.max_tokens, u.tokens + r.tokens, lim.reserve_tokens or 0)
            cost = left(lim.max_cost_usd, (u.cost_usd or 0.0) + (r.cost_usd or 0.0))
            return Remaining(
                seconds=None if secs is None else float(secs),
                steps=None if lim.max_steps is None else int(left(lim.max_steps, u.steps) or 0),
                tokens=None if toks is None else int(toks),
                cost_usd=None if cost is None else float(cost),
                tool_calls=None
                if lim.max_tool_calls is None
                else int(left(lim.max_tool_calls, u.tool_calls + r.tool_calls) or 0),
                model_calls=None
                if lim.max_model_calls is None
                else int(left(lim.max_model_calls, u.model_calls) or 0),
            )

    def utilisation(self) -> tuple[float | None, str | None]:
        with self._lock:
            return _utilisation(self._limits, self._usage, self._elapsed_locked())

    def effective_timeout(
        self, configured_s: float | None, *, final_answer: bool = False
    ) -> float | None:
        """``min(configured_s, remaining seconds - timeout_margin_s)``, floored at 0.

        Remaining seconds are net of the final-answer reserve, so ordinary I/O cannot eat the
        time kept for the answer; pass ``final_answer=True`` for the answer's own call, which
        may use the reserve up to the hard deadline. ``None`` if neither bound exists.
        """
        with self._lock:
            lim = self._limits
            if lim.deadline_s is None:
                return configured_s
            left = lim.deadline_s - self._elapsed_locked()
            if not final_answer:
                left -= lim.reserve_s or 0.0
            bound = max(0.0, left - lim.timeout_margin_s)
        return bound if configured_s is None else max(0.0, min(configured_s, bound))

    def decide(
        self,
        *,
        phase: Phase = Phase.BEFORE_STEP,
        completed: bool = False,
        cancel: Reason | None = None,
        cancel_detail: str = "",
        loop: LoopVerdict | None = None,
    ) -> Decision:
        """:func:`guard.policy.decide` on this budget's limits, usage, clock and reservations."""
        # decide() is pure and quick: run it under the lock on the live counters, no copies.
        with self._lock:
            return _decide(
                self._limits,
                self._usage,
                elapsed_s=self._elapsed_locked(),
                phase=phase,
                completed=completed,
                cancel=cancel,
                cancel_detail=cancel_detail,
                loop=loop,
                reserved=self._reserved,
            )
