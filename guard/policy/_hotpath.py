"""The budget's fused hot paths: record usage and decide under one lock acquisition.

The SDK records three things per step (a step, a model call, a tool call) and decides after
each; the guard does the same per span. Each method here is exactly its ``Budget.record_*``
call followed by :meth:`HotPaths.decide_quick`, made atomic, with a cheap pre-check
(``could_act()`` inlined, trigger points cached on the budget) that skips the full decision
when nothing stronger than what the run was already told can fire. Kept apart from
``_budget.py`` so the counting and reservation logic stays readable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from guard.policy._decide import _NEVER
from guard.policy._decide import _RANK as _ACTION_RANK
from guard.policy._decide import _triggers as _trigger_points
from guard.policy._decide import decide as _decide
from guard.policy._reservation import plain_counts, plain_money
from guard.policy._types import Action, Decision, Phase

if TYPE_CHECKING:  # pragma: no cover
    from guard.policy._budget import Budget
    from guard.policy._loops import LoopVerdict
    from guard.policy._reservation import Reservation

__all__ = ["HotPaths"]

_AFTER_MODEL, _AFTER_TOOLS = Phase.AFTER_MODEL_CALL, Phase.AFTER_TOOL_BATCH


class HotPaths:
    """Mixin of :class:`~guard.policy.Budget` (it owns the state; this holds no slots)."""

    __slots__ = ()

    def decide_quick(
        self,
        *,
        phase: Phase = Phase.BEFORE_STEP,
        loop: LoopVerdict | None = None,
        above: Action = Action.CONTINUE,
    ) -> Decision | None:
        """:meth:`decide`, or ``None`` when it cannot return anything stronger than ``above``.

        For hot paths that only act on a decision stronger than what the run was already told
        (``above``: CONTINUE, or the WARN / WRAP_UP already given). A cheap pre-check
        (:func:`~guard.policy._decide.could_act`, inlined) skips the full evaluation when no
        check can fire; whenever a decision is returned it is exactly ``decide()``'s.
        """
        with self._lock:
            return self._quick_locked(phase, loop, _ACTION_RANK[above])

    def _quiet_locked(self, rank: int) -> bool:
        """True when no check of decide() can fire above ``rank``: ``could_act()`` inlined,
        with this budget's trigger points kept on the budget (hot path). The clock is read
        only when a deadline is set."""
        limits = self._limits
        trig = self._trig
        if trig[0] is not limits or trig[1] != rank:
            if rank >= 3:
                return True
            trig = self._trig = (limits, rank, _trigger_points(limits, rank))
        t = trig[2]
        u = self._usage
        tokens = u.input_tokens + u.output_tokens
        if (
            u.steps >= t[0]
            or u.model_calls >= t[1]
            or tokens >= t[2]
            or u.tool_calls >= t[5]
            or (t[3] != _NEVER and tokens + self._reserved.tokens >= t[3])
            or (u.cost_usd is not None and u.cost_usd >= t[4])
        ):
            return False
        if limits.deadline_s is None:  # then the clock cannot make anything fire: not read
            return True
        elapsed = self._elapsed_locked()
        return not (elapsed >= t[6] or elapsed >= t[7])

    def _quick_locked(self, phase: Phase, loop: LoopVerdict | None, rank: int) -> Decision | None:
        if (loop is None or _ACTION_RANK[loop.level] <= rank) and self._quiet_locked(rank):
            return None
        return _decide(
            self._limits,
            self._usage,
            elapsed_s=self._elapsed_locked(),
            phase=phase,
            loop=loop,
            reserved=self._reserved,
        )

    # -- fused hot paths (the SDK: one lock per call instead of record + decide) -------------
    # ``rank`` is the caller's soft level as a number (CONTINUE 0, WARN 1, WRAP_UP 2), as in
    # SoftLevel; each method is exactly its record_* call followed by decide_quick(), made
    # atomic.

    def step_if_quiet(self, rank: int = 0) -> int:
        """``record_step()`` if ``decide_quick(BEFORE_STEP)`` would return ``None``; returns
        the step's record number (``seq``, >= 1). ``0``: nothing recorded, the caller decides
        in full first."""
        with self._lock:
            if not self._quiet_locked(rank):
                return 0
            b: Budget | None = self
            while b is not None:
                b._usage.steps += 1
                b = b._parent
            self._seq += 1
            return self._seq

    def model_call_quick(
        self,
        input_tokens: int,
        output_tokens: int,
        reasoning_tokens: int,
        cached_tokens: int,
        cost_usd: float | None,
        rank: int = 0,
        settles: Reservation | None = None,
    ) -> tuple[int, Decision | None]:
        """``record_model_call(...)`` then ``decide_quick(AFTER_MODEL_CALL)``, atomically.
        Returns ``(record number, decision or None)``.

        ``settles``: the reservation this call settles. Its estimate is freed in the same
        lock that records the actual usage, so no other call can slip into the freed room
        before the actual is counted (a reservation already settled or released: the call
        is only recorded)."""
        if not (
            plain_counts(input_tokens, output_tokens, reasoning_tokens, cached_tokens)
            and (cost_usd is None or plain_money(cost_usd))
        ):
            seq = self.record_model_call(  # validates (raises) and records
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                reasoning_tokens=reasoning_tokens,
                cached_tokens=cached_tokens,
                cost_usd=cost_usd,
            )
            if settles is not None:
                # Recorded first, then freed: for an instant both count (never oversold).
                settles.release()
            with self._lock:
                return seq, self._quick_locked(_AFTER_MODEL, None, rank)
        with self._lock:
            if settles is not None and not settles.done:
                settles.done = True
                settles.owner._drop_locked(settles)
            self._add_model_call_locked(
                input_tokens, output_tokens, reasoning_tokens, cached_tokens, cost_usd
            )
            if self._quiet_locked(rank):
                return self._seq, None
            return self._seq, _decide(
                self._limits,
                self._usage,
                elapsed_s=self._elapsed_locked(),
                phase=_AFTER_MODEL,
                reserved=self._reserved,
            )

    def tool_calls_quick(
        self,
        attempts: int,
        cost_usd: float | None,
        loop: LoopVerdict | None,
        rank: int = 0,
    ) -> tuple[int, Decision | None]:
        """``record_tool_calls(1, ...)`` then ``decide_quick(AFTER_TOOL_BATCH, loop)``,
        atomically. Returns ``(record number, decision or None)``."""
        if type(attempts) is not int or attempts < 0 or cost_usd is not None:
            seq = self.record_tool_calls(1, attempts=attempts, cost_usd=cost_usd)
            with self._lock:
                return seq, self._quick_locked(_AFTER_TOOLS, loop, rank)
        with self._lock:
            b: Budget | None = self
            while b is not None:
                u = b._usage
                u.tool_calls += 1
                u.tool_attempts += attempts
                b = b._parent
            self._seq += 1
            if loop is None and self._quiet_locked(rank):
                return self._seq, None
            return self._seq, self._quick_locked(_AFTER_TOOLS, loop, rank)
