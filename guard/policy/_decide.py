"""The decision function: one fixed order of checks, shared by the SDK and the guard.

Order (DESIGN §3.5): cancel -> completed -> deadline -> max steps (and model calls) -> tokens
-> cost -> tool quota -> loop or stagnation -> final-answer reserve -> soft thresholds ->
continue. The first check that fires wins, so completion wins over a budget reached in the same
step, and a cancel wins over everything.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, ClassVar

from guard.policy._types import (
    CONTINUE,
    REASON_STATUS,
    Action,
    Decision,
    Limits,
    Phase,
    Reason,
    Status,
    Usage,
)

if TYPE_CHECKING:  # pragma: no cover
    from guard.policy._loops import LoopVerdict

__all__ = ["SoftLevel", "could_act", "decide", "utilisation"]


def _fmt(x: float | int) -> str:
    """Numbers in messages: ints as ints, floats with up to 4 significant decimals."""
    if isinstance(x, float):
        if x.is_integer() and abs(x) < 1e15:
            return str(int(x))
        return f"{x:.4g}" if abs(x) < 1e-3 else f"{x:.4f}".rstrip("0").rstrip(".")
    return str(x)


def utilisation(
    limits: Limits, usage: Usage, elapsed_s: float | None
) -> tuple[float | None, str | None]:
    """The highest fraction of any set limit used so far, and the metric it belongs to.

    Metrics: ``steps``, ``model_calls``, ``tool_calls``, ``tokens``, ``cost_usd``,
    ``elapsed_s``. ``(None, None)`` when no limit is set.
    """
    # Unrolled on purpose: this runs on every span the guard ingests.
    best = -1.0
    metric: str | None = None
    lim = limits.deadline_s
    if lim is not None and elapsed_s is not None:
        best, metric = (elapsed_s / lim if lim > 0 else math.inf), "elapsed_s"
    lim = limits.max_steps
    if lim is not None:
        f = usage.steps / lim if lim > 0 else math.inf
        if f > best:
            best, metric = f, "steps"
    lim = limits.max_model_calls
    if lim is not None:
        f = usage.model_calls / lim if lim > 0 else math.inf
        if f > best:
            best, metric = f, "model_calls"
    lim = limits.max_tokens
    if lim is not None:
        f = (usage.input_tokens + usage.output_tokens) / lim if lim > 0 else math.inf
        if f > best:
            best, metric = f, "tokens"
    lim = limits.max_cost_usd
    if lim is not None and usage.cost_usd is not None:
        f = usage.cost_usd / lim if lim > 0 else math.inf
        if f > best:
            best, metric = f, "cost_usd"
    lim = limits.max_tool_calls
    if lim is not None:
        f = usage.tool_calls / lim if lim > 0 else math.inf
        if f > best:
            best, metric = f, "tool_calls"
    return (None, None) if metric is None else (best, metric)


_METRIC_REASON = {
    "elapsed_s": Reason.DEADLINE,
    "steps": Reason.MAX_STEPS,
    "model_calls": Reason.MAX_STEPS,
    "tokens": Reason.TOKEN_BUDGET,
    "cost_usd": Reason.COST_BUDGET,
    "tool_calls": Reason.MAX_TOOL_CALLS,
}


def _stop(reason: Reason, util: float | None, metric: str | None, message: str) -> Decision:
    return Decision(Action.STOP, REASON_STATUS[reason], reason, util, metric, message)


def decide(
    limits: Limits,
    usage: Usage,
    *,
    elapsed_s: float | None,
    phase: Phase = Phase.BEFORE_STEP,
    completed: bool = False,
    cancel: Reason | None = None,
    cancel_detail: str = "",
    loop: LoopVerdict | None = None,
    reserved: Usage | None = None,
) -> Decision:
    """Evaluate the policy once. Pure: same inputs, same decision.

    ``phase`` changes only the count limits that gate *starting* something: before a step,
    ``max_steps`` (and ``max_model_calls``) stop when the count has *reached* the limit, since
    there is no room for another; after a model call or tool batch they stop only when the count
    *exceeds* it. Spend limits (tokens, cost, tool calls, deadline) stop once reached in every
    phase. ``reserved`` (outstanding reservations) counts toward the working budget only.
    """
    util, metric = utilisation(limits, usage, elapsed_s)
    if cancel is not None:
        msg = f"cancelled: {cancel.value}" + (f" ({cancel_detail})" if cancel_detail else "")
        return _stop(cancel, util, metric, msg)
    if completed:
        return Decision(
            Action.STOP, Status.COMPLETED, Reason.FINAL_ANSWER, util, metric, "final answer"
        )
    before = phase is Phase.BEFORE_STEP
    if limits.deadline_s is not None and elapsed_s is not None and elapsed_s >= limits.deadline_s:
        return _stop(
            Reason.DEADLINE,
            util,
            "elapsed_s",
            f"deadline_s {_fmt(limits.deadline_s)} reached (elapsed_s={elapsed_s:.3f})",
        )
    for name, used, limit in (
        ("steps", usage.steps, limits.max_steps),
        ("model_calls", usage.model_calls, limits.max_model_calls),
    ):
        if limit is not None and (used >= limit if before else used > limit):
            verb = "reached" if used == limit else "exceeded"
            return _stop(Reason.MAX_STEPS, util, name, f"max_{name} {limit} {verb} ({name}={used})")
    if limits.max_tokens is not None and usage.tokens >= limits.max_tokens:
        return _stop(
            Reason.TOKEN_BUDGET,
            util,
            "tokens",
            f"max_tokens {limits.max_tokens} reached (tokens={usage.tokens}: "
            f"input={usage.input_tokens} output={usage.output_tokens})",
        )
    if (
        limits.max_cost_usd is not None
        and usage.cost_usd is not None
        and usage.cost_usd >= limits.max_cost_usd
    ):
        return _stop(
            Reason.COST_BUDGET,
            util,
            "cost_usd",
            f"max_cost_usd {_fmt(limits.max_cost_usd)} reached (cost_usd={usage.cost_usd:.6f})",
        )
    if limits.max_tool_calls is not None and usage.tool_calls >= limits.max_tool_calls:
        return _stop(
            Reason.MAX_TOOL_CALLS,
            util,
            "tool_calls",
            f"max_tool_calls {limits.max_tool_calls} reached (tool_calls={usage.tool_calls})",
        )
    if loop is not None and loop.level is Action.STOP:
        reason = loop.reason or Reason.LOOP_DETECTED
        return _stop(reason, util, metric, loop.detail or f"{reason.value} ({loop.pattern})")
    wrap = _reserve_check(limits, usage, elapsed_s, reserved)
    if wrap is not None:
        return Decision(Action.WRAP_UP, None, wrap[0], util, wrap[1], wrap[2])
    soft = limits.soft_thresholds
    if util is not None and metric is not None and len(soft) >= 2 and util >= soft[1]:
        return Decision(
            Action.WRAP_UP,
            None,
            _METRIC_REASON[metric],
            util,
            metric,
            f"{metric} at {util:.0%} of its limit (wrap_up threshold {soft[1]:.0%})",
        )
    if loop is not None and loop.level is Action.WARN:
        reason = loop.reason or Reason.LOOP_DETECTED
        return Decision(Action.WARN, None, reason, util, metric, loop.detail)
    if util is not None and metric is not None and soft and util >= soft[0]:
        return Decision(
            Action.WARN,
            None,
            _METRIC_REASON[metric],
            util,
            metric,
            f"{metric} at {util:.0%} of its limit (warn threshold {soft[0]:.0%})",
        )
    if util is None:
        return CONTINUE
    return Decision(Action.CONTINUE, utilisation=util, metric=metric)


def _reserve_check(
    limits: Limits, usage: Usage, elapsed_s: float | None, reserved: Usage | None
) -> tuple[Reason, str, str] | None:
    """The working budget (hard limit minus the final-answer reserve) is used up -> wrap up."""
    if limits.max_tokens is not None and limits.reserve_tokens:
        working = limits.max_tokens - limits.reserve_tokens
        used = usage.tokens + (reserved.tokens if reserved is not None else 0)
        if used >= working:
            return (
                Reason.TOKEN_BUDGET,
                "tokens",
                f"working token budget {working} used (tokens={used}); "
                f"{limits.reserve_tokens} tokens reserved for the final answer",
            )
    if limits.deadline_s is not None and limits.reserve_s and elapsed_s is not None:
        working_s = limits.deadline_s - limits.reserve_s
        if elapsed_s >= working_s:
            return (
                Reason.DEADLINE,
                "elapsed_s",
                f"working time {_fmt(working_s)}s used (elapsed_s={elapsed_s:.3f}); "
                f"{_fmt(limits.reserve_s)}s reserved for the final answer",
            )
    return None


# -- the quick pre-check ------------------------------------------------------------------
# Most evaluations on an agent's hot path (three per step) return a plain CONTINUE. could_act()
# rules that out with a handful of comparisons against trigger points precomputed per Limits
# object: the usage at which *any* check of decide() that can produce an action stronger than
# the caller's current level could fire. It never changes a decision: when it cannot rule one
# out, the caller runs decide() itself.

_RANK = {Action.CONTINUE: 0, Action.WARN: 1, Action.WRAP_UP: 2, Action.STOP: 3}
# Relative slack below every fractional trigger, so that float rounding in
# ``used / limit >= fraction`` (utilisation) can never fire where the trigger would not.
_SLACK = 1e-9
_NEVER = math.inf
_ALWAYS = -math.inf
# (id(limits), rank) -> (limits, triggers). Holding the Limits keeps its id from being reused
# while cached; bounded because limits objects come from code and policy, a few per process.
_TRIGGERS: dict[tuple[int, int], tuple[Limits, tuple[float, ...]]] = {}
_TRIGGERS_MAX = 4096
# The most recent (limits, rank, triggers): replaced whole, never mutated.
_LAST: tuple[Limits | None, int, tuple[float, ...]] = (None, -1, ())


def _fraction_trigger(limit: float | None, fraction: float) -> float:
    if limit is None:
        return _NEVER
    if not (limit > 0 and fraction > 0) or not math.isfinite(fraction):
        return _ALWAYS  # 0 limits, 0/negative/NaN thresholds: leave it all to decide()
    return fraction * limit * (1.0 - _SLACK)


def _triggers(limits: Limits, rank: int) -> tuple[float, ...]:
    key = (id(limits), rank)
    hit = _TRIGGERS.get(key)
    if hit is not None and hit[0] is limits:
        return hit[1]
    soft = limits.soft_thresholds
    if rank == 0:  # anything but CONTINUE matters: the lowest soft threshold
        fraction = min((1.0, *soft))
    elif rank == 1:  # already warned: only WRAP_UP (second threshold, reserve) or STOP
        fraction = min(1.0, soft[1]) if len(soft) >= 2 else 1.0
    else:  # already told to wrap up: only a hard stop
        fraction = 1.0
    if any(not isinstance(x, int | float) or math.isnan(x) for x in soft):
        fraction = _ALWAYS
    reserve = rank < 2  # the final-answer reserve yields WRAP_UP
    tokens_reserve = _NEVER
    if reserve and limits.max_tokens is not None and limits.reserve_tokens:
        tokens_reserve = limits.max_tokens - limits.reserve_tokens
    elapsed_reserve = _NEVER
    if reserve and limits.deadline_s is not None and limits.reserve_s:
        elapsed_reserve = limits.deadline_s - limits.reserve_s
    trig = (
        _fraction_trigger(limits.max_steps, fraction),
        _fraction_trigger(limits.max_model_calls, fraction),
        _fraction_trigger(limits.max_tokens, fraction),
        tokens_reserve,
        _fraction_trigger(limits.max_cost_usd, fraction),
        _fraction_trigger(limits.max_tool_calls, fraction),
        _fraction_trigger(limits.deadline_s, fraction),
        elapsed_reserve,
    )
    if len(_TRIGGERS) >= _TRIGGERS_MAX:
        _TRIGGERS.clear()
    _TRIGGERS[key] = (limits, trig)
    return trig


def could_act(
    limits: Limits,
    usage: Usage,
    *,
    elapsed_s: float | None,
    reserved: Usage | None = None,
    above: Action = Action.CONTINUE,
) -> bool:
    """False only when :func:`decide` (without cancel, completion or a loop verdict) is certain
    to return nothing stronger than ``above``; True means "run decide() to know".

    A caller that has already been given a WARN (or WRAP_UP) passes it as ``above``: weaker
    decisions would be ignored anyway, so fewer checks need a full evaluation.
    """
    return _could_act(limits, usage, elapsed_s, reserved, _RANK[above])


def _could_act(
    limits: Limits, usage: Usage, elapsed_s: float | None, reserved: Usage | None, rank: int
) -> bool:
    """:func:`could_act` with positional arguments and the level as a rank (hot path)."""
    if rank >= 3:
        return False
    global _LAST
    last = _LAST  # one atomic read of an immutable tuple: safe with concurrent writers
    if last[0] is limits and last[1] == rank:  # one run stepping: no key, no lookup
        t = last[2]
    else:
        hit = _TRIGGERS.get((id(limits), rank))
        t = hit[1] if hit is not None and hit[0] is limits else _triggers(limits, rank)
        _LAST = (limits, rank, t)
    tokens = usage.input_tokens + usage.output_tokens
    if (
        usage.steps >= t[0]
        or usage.model_calls >= t[1]
        or tokens >= t[2]
        or usage.tool_calls >= t[5]
    ):
        return True
    if t[3] != _NEVER and tokens + (reserved.tokens if reserved is not None else 0) >= t[3]:
        return True
    if usage.cost_usd is not None and usage.cost_usd >= t[4]:
        return True
    return elapsed_s is not None and (elapsed_s >= t[6] or elapsed_s >= t[7])


_LEVELS = (Action.CONTINUE, Action.WARN, Action.WRAP_UP)


class SoftLevel:
    """Remembers which soft action a run was already given, so each is pushed once.

    ``advance`` returns ``WARN`` the first time a WARN (or stronger) decision arrives and
    ``WRAP_UP`` the first time a WRAP_UP arrives; a WRAP_UP that arrives first skips the WARN.
    Everything else returns ``None``. Thread-safe.
    """

    __slots__ = ("_level", "_lock")

    _RANK: ClassVar[dict[Action, int]] = {
        Action.CONTINUE: 0,
        Action.WARN: 1,
        Action.WRAP_UP: 2,
        Action.STOP: 3,
    }

    def __init__(self) -> None:
        self._level = 0
        self._lock = threading.Lock()

    @property
    def level(self) -> Action:
        return _LEVELS[self._level]

    def advance(self, decision: Decision) -> Action | None:
        rank = self._RANK[decision.action]
        if rank == 0 or rank == 3:
            return None
        with self._lock:
            if rank <= self._level:
                return None
            self._level = rank
        return decision.action

    def reset(self) -> None:
        with self._lock:
            self._level = 0
