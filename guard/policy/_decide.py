"""The decision function: one fixed order of checks, shared by the SDK and the guard.

The stop order: cancel -> completed -> deadline -> max steps (and model calls) -> tokens ->
cost -> tool quota -> loop or stagnation -> final-answer reserve -> soft thresholds ->
continue. The first check that fires wins, so completion wins over a budget reached in the same
step, and a cancel wins over everything.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING

from guard.policy._types import (
    CONTINUE,
    METRIC_REASON,
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

__all__ = ["SoftLevel", "decide", "utilisation"]


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
            METRIC_REASON[metric],
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
            METRIC_REASON[metric],
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


_BY_RANK = tuple(Action)  # rank -> action


class SoftLevel:
    """Remembers which soft action a run was already given, so each is pushed once.

    ``advance`` returns ``WARN`` the first time a WARN (or stronger) decision arrives and
    ``WRAP_UP`` the first time a WRAP_UP arrives; a WRAP_UP that arrives first skips the WARN.
    Everything else returns ``None``. Thread-safe.
    """

    __slots__ = ("_lock", "rank")

    def __init__(self) -> None:
        # the rank (Action.rank) of the strongest soft action given so far: read by the hot
        # paths as a plain attribute (the ``above`` of the escalation checks); only this class
        # writes it, under its lock
        self.rank = 0
        self._lock = threading.Lock()

    @property
    def level(self) -> Action:
        return _BY_RANK[self.rank]

    def advance(self, decision: Decision) -> Action | None:
        rank = decision.action.rank
        if rank == 0 or rank == 3:
            return None
        with self._lock:
            if rank <= self.rank:
                return None
            self.rank = rank
        return decision.action

    def reset(self) -> None:
        with self._lock:
            self.rank = 0
