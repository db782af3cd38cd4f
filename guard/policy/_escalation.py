"""Escalations: what :func:`~guard.policy.decide` says, when it outranks what the run was told.

A run acts on a decision only when it is stronger than the level it already has (SoftLevel
pushes each soft level once, a stop ends the run), and most evaluations on the hot paths
(three per step in the SDK, one per touched run per request in the guard) find nothing
stronger. Every method here guarantees the same thing: it returns exactly ``decide()``'s
decision when that outranks the caller's level, and ``None`` when it does not. The
``record_*``-then-decide methods also record under the same lock acquisition, so no other
thread's usage can fall between the record and the decision.

How it is quick (an implementation detail): :class:`Triggers`, the usage at which any check
of ``decide()`` that could produce something stronger than a given rank can fire, computed
once per ``(limits, rank)`` and kept on the budget; a few comparisons against them rule the
full evaluation out. The tests hold these methods to ``decide()`` (tests/policy).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from guard.policy._decide import decide as _decide
from guard.policy._reservation import check_model_call, plain_counts, plain_money
from guard.policy._types import Action, Decision, Limits, Phase

if TYPE_CHECKING:  # pragma: no cover
    from guard.policy._budget_state import BudgetState as _Host
    from guard.policy._loops import LoopVerdict
    from guard.policy._reservation import Reservation
else:
    _Host = object  # the mixin's base at run time

__all__ = ["UNSET", "Escalations", "Triggers", "triggers"]

_AFTER_MODEL, _AFTER_TOOLS = Phase.AFTER_MODEL_CALL, Phase.AFTER_TOOL_BATCH
_STOP_RANK = Action.STOP.rank
# Relative slack below every fractional trigger, so that float rounding in
# ``used / limit >= fraction`` (utilisation) can never fire where the trigger would not.
_SLACK = 1e-9
_NEVER = math.inf
_ALWAYS = -math.inf


@dataclass(frozen=True, slots=True)
class Triggers:
    """The usage at or above which ``decide()`` under ``limits`` may return something
    stronger than ``rank`` (``inf``: that check cannot; ``-inf``: always ask ``decide()``).

    A slotted class, not a NamedTuple: its fields read as fast as tuple indexes on the hot
    path, where a NamedTuple's attribute reads measured about 30% slower.
    """

    limits: Limits | None
    rank: int
    steps: float
    model_calls: float
    tokens: float
    tokens_reserve: float  # tokens + reserved: the final-answer reserve is reached (WRAP_UP)
    cost_usd: float
    tool_calls: float
    elapsed_s: float
    elapsed_reserve_s: float  # the working time (deadline minus reserve) is used (WRAP_UP)


UNSET = Triggers(None, -1, *(_NEVER,) * 8)  # a new budget's: matches no limits
# (id(limits), rank) -> triggers, shared by the budgets of equal limits objects. The entry
# holds the Limits, so its id is not reused while cached; bounded because limits objects
# come from code and policy, a few per process.
_CACHE: dict[tuple[int, int], Triggers] = {}
_CACHE_MAX = 4096


def _fraction(limit: float | None, fraction: float) -> float:
    if limit is None:
        return _NEVER
    if not (limit > 0 and fraction > 0) or not math.isfinite(fraction):
        return _ALWAYS  # 0 limits, 0/negative/NaN thresholds: leave it all to decide()
    point = fraction * limit * (1.0 - _SLACK)
    if point >= sys.float_info.min:
        return point
    # A product in the subnormal range has lost the precision the slack relies on (it may be
    # 0, which an unused budget would "reach", or above a usage of 5e-324 that decide() lets
    # pass under a 1.1e-308 limit): there, the smallest usage whose utilisation reaches the
    # fraction, found from the product in a few float steps (the division is monotone in the
    # usage, so every usage below it stays under the fraction).
    x = fraction * limit
    for _ in range(64):
        below = math.nextafter(x, 0.0)
        if x <= 0.0 or below / limit < fraction:
            break
        x = below
    for _ in range(64):
        if x / limit >= fraction:
            return x
        x = math.nextafter(x, _NEVER)
    return _ALWAYS  # not found near the product (cannot happen): leave it to decide()


def triggers(limits: Limits, rank: int) -> Triggers:
    """The trigger points of ``limits`` for a run already told the action of ``rank``."""
    hit = _CACHE.get((id(limits), rank))
    if hit is not None and hit.limits is limits:
        return hit
    soft = limits.soft_thresholds
    if rank == 0:  # anything but CONTINUE matters: the lowest soft threshold
        fraction = min((1.0, *soft))
    elif rank == 1:  # already warned: only WRAP_UP (second threshold, reserve) or STOP
        fraction = min(1.0, soft[1]) if len(soft) >= 2 else 1.0
    else:  # already told to wrap up: only a hard stop
        fraction = 1.0
    if any(not isinstance(x, int | float) or math.isnan(x) for x in soft):
        fraction = _ALWAYS
    reserve = rank < Action.WRAP_UP.rank  # the final-answer reserve yields WRAP_UP
    tokens_reserve = _NEVER
    if reserve and limits.max_tokens is not None and limits.reserve_tokens:
        tokens_reserve = limits.max_tokens - limits.reserve_tokens
    elapsed_reserve = _NEVER
    if reserve and limits.deadline_s is not None and limits.reserve_s:
        elapsed_reserve = limits.deadline_s - limits.reserve_s
    t = Triggers(
        limits,
        rank,
        steps=_fraction(limits.max_steps, fraction),
        model_calls=_fraction(limits.max_model_calls, fraction),
        tokens=_fraction(limits.max_tokens, fraction),
        tokens_reserve=tokens_reserve,
        cost_usd=_fraction(limits.max_cost_usd, fraction),
        tool_calls=_fraction(limits.max_tool_calls, fraction),
        elapsed_s=_fraction(limits.deadline_s, fraction),
        elapsed_reserve_s=elapsed_reserve,
    )
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.clear()
    _CACHE[(id(limits), rank)] = t
    return t


class Escalations(_Host):
    """Mixin of :class:`~guard.policy.Budget` (it owns the state; this holds no slots).

    ``rank`` arguments are the caller's level as :attr:`Action.rank` (the SDK keeps it as a
    number in SoftLevel).
    """

    __slots__ = ()

    def escalation(
        self,
        *,
        phase: Phase = Phase.BEFORE_STEP,
        loop: LoopVerdict | None = None,
        above: Action = Action.CONTINUE,
    ) -> Decision | None:
        """:meth:`decide` when its action outranks ``above`` (CONTINUE, or the WARN /
        WRAP_UP the run was already given), else ``None``."""
        with self._lock:
            return self._escalation_locked(phase, loop, above.rank)

    def _quiet_locked(self, rank: int) -> bool:
        """True when no check of decide() can fire above ``rank`` (loop verdicts aside). The
        clock is read only when a deadline is set."""
        limits = self._limits
        t = self._trig
        if t.limits is not limits or t.rank != rank:
            if rank >= _STOP_RANK:
                return True
            t = self._trig = triggers(limits, rank)
        u = self._usage
        tokens = u.input_tokens + u.output_tokens
        if (
            u.steps >= t.steps
            or u.model_calls >= t.model_calls
            or tokens >= t.tokens
            or u.tool_calls >= t.tool_calls
            or (t.tokens_reserve != _NEVER and tokens + self._reserved.tokens >= t.tokens_reserve)
            or (u.cost_usd is not None and u.cost_usd >= t.cost_usd)
        ):
            return False
        if limits.deadline_s is None:  # then the clock cannot make anything fire: not read
            return True
        elapsed = self._elapsed_locked()
        return not (elapsed >= t.elapsed_s or elapsed >= t.elapsed_reserve_s)

    def _escalation_locked(
        self, phase: Phase, loop: LoopVerdict | None, rank: int
    ) -> Decision | None:
        if (loop is None or loop.level.rank <= rank) and self._quiet_locked(rank):
            return None
        d = _decide(
            self._limits,
            self._usage,
            elapsed_s=self._elapsed_locked(),
            phase=phase,
            loop=loop,
            reserved=self._reserved,
        )
        return d if d.action.rank > rank else None

    # -- record, then the escalation, under one lock (the SDK's three calls per step) ------

    def step_if_no_escalation(self, rank: int = 0) -> int:
        """``record_step()`` when ``escalation(BEFORE_STEP)`` is ``None``; returns the step's
        record number (``seq``, >= 1). ``0``: nothing recorded, the caller decides in full
        first."""
        with self._lock:
            if not self._quiet_locked(rank):
                return 0
            for u in self._usages:
                u.steps += 1
            self._seq += 1
            return self._seq

    def model_call_escalation(
        self,
        input_tokens: int,
        output_tokens: int,
        reasoning_tokens: int,
        cached_tokens: int,
        cost_usd: float | None,
        rank: int = 0,
        settles: Reservation | None = None,
    ) -> tuple[int, Decision | None]:
        """``record_model_call(...)`` then ``escalation(AFTER_MODEL_CALL)``, atomically.
        Returns ``(record number, escalation or None)``.

        ``settles``: the reservation this call settles. Its estimate is freed in the same
        lock that records the actual usage, so no other call can slip into the freed room
        before the actual is counted (a reservation already settled or released: the call
        is only recorded)."""
        if not (
            plain_counts(input_tokens, output_tokens, reasoning_tokens, cached_tokens)
            and (cost_usd is None or plain_money(cost_usd))
        ):  # the full check (raises before anything is freed or recorded)
            cost_usd = check_model_call(
                input_tokens, output_tokens, reasoning_tokens, cached_tokens, cost_usd
            )
        with self._lock:
            if settles is not None and not settles.done:
                settles.done = True
                settles.owner._drop_locked(settles)
            self._add_model_call_locked(
                input_tokens, output_tokens, reasoning_tokens, cached_tokens, cost_usd
            )
            if self._quiet_locked(rank):  # the usual case, without another call
                return self._seq, None
            return self._seq, self._escalation_locked(_AFTER_MODEL, None, rank)

    def tool_call_escalation(
        self,
        attempts: int,
        cost_usd: float | None,
        loop: LoopVerdict | None,
        rank: int = 0,
    ) -> tuple[int, Decision | None]:
        """``record_tool_calls(1, ...)`` then ``escalation(AFTER_TOOL_BATCH, loop)``,
        atomically. Returns ``(record number, escalation or None)``."""
        if type(attempts) is not int or attempts < 0 or cost_usd is not None:
            seq = self.record_tool_calls(1, attempts=attempts, cost_usd=cost_usd)
            with self._lock:
                return seq, self._escalation_locked(_AFTER_TOOLS, loop, rank)
        with self._lock:
            for u in self._usages:
                u.tool_calls += 1
                u.tool_attempts += attempts
            self._seq += 1
            if loop is None and self._quiet_locked(rank):  # the usual case, without another call
                return self._seq, None
            return self._seq, self._escalation_locked(_AFTER_TOOLS, loop, rank)
