"""Building a run's :class:`~guard.policy.Outcome` and classifying exceptions into reasons."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from guard import semconv as A
from guard.errors import RunStopped
from guard.policy import REASON_STATUS, DecidedBy, Outcome, Reason, Status

if TYPE_CHECKING:  # pragma: no cover
    from guard.sdk._run import LiveRun

__all__ = [
    "ORIGIN_ATTR",
    "Interrupt",
    "build_outcome",
    "cancel_message",
    "classify_exception",
    "final_outcome",
    "outcome_attrs",
    "tag",
]

# Exceptions raised by an @guard.tool or reported via step.model_call(error=...) are tagged,
# so an exception escaping the run is recorded as tool_error / model_error, not just error.
ORIGIN_ATTR = "__otel_guard_origin__"

_MODEL_MODULES = ("openai", "anthropic", "google.genai", "google.api_core", "litellm", "mistral")
_NOT_RECOVERABLE = {Reason.LOOP_DETECTED, Reason.NO_PROGRESS, Reason.INVALID_DECISION}


class Interrupt(NamedTuple):
    """A stop that reached the run from outside its steps: a cancel (operator, guard, tenant
    budget) or the SDK's own deadline. ``cancel`` is False for a deadline, which lets a run
    that completes in the same step keep its completion."""

    reason: Reason
    detail: str
    decided_by: DecidedBy
    cancel: bool


def tag(exc: BaseException, origin: str) -> None:
    with contextlib.suppress(AttributeError, TypeError):  # exceptions with __slots__
        setattr(exc, ORIGIN_ATTR, origin)


def classify_exception(exc: BaseException) -> Reason:
    """tool_error / model_error for tagged or provider exceptions, else error."""
    origin = getattr(exc, ORIGIN_ATTR, None)
    if origin == "tool":
        return Reason.TOOL_ERROR
    if origin == "model":
        return Reason.MODEL_ERROR
    module = type(exc).__module__ or ""
    if module.startswith(_MODEL_MODULES):
        return Reason.MODEL_ERROR
    return Reason.ERROR


def build_outcome(
    run: LiveRun, status: Status, reason: Reason, message: str, by: DecidedBy
) -> Outcome:
    u = run.budget.usage()
    limits = run.budget.limits
    stopped = status is not Status.COMPLETED
    partial = run.partial_result if run.partial_result is not None else run.did_work
    return Outcome.from_usage(
        u,
        limits=limits,
        elapsed_s=run.elapsed_s(),
        run_id=run.run_id,
        status=status,
        reason=reason,
        message=message,
        parent_run_id=run.parent_run_id,
        tenant=run.tenant,
        agent=run.agent,
        trace_id=run.trace_id,
        last_tool=run.last_tool,
        last_action_hash=run.last_action_hash,
        loop_hits=run.detector.hits,
        partial_result=(bool(partial) and stopped) or run.resumable,
        recoverable=(
            stopped
            and status in (Status.TERMINATED, Status.CANCELLED, Status.DEGRADED)
            and reason not in _NOT_RECOVERABLE
        )
        or reason is Reason.MODEL_ERROR
        or run.resumable,
        decided_by=by,
        price_book_version=run.price_book_version,
        started_at=run.started_at,
        ended_at=time.time(),
    )


def final_outcome(run: LiveRun, exc: BaseException | None) -> tuple[Outcome, bool]:
    """The outcome of a run that is unwinding with ``exc`` (``None`` = returned normally).

    Returns ``(outcome, stopped)``; ``stopped`` means the decorator raises ``RunStopped``
    (or lets the original exception through for non-stop failures). Order: an explicit cancel
    wins over everything; completion wins over a budget reached in the same step; a stop the
    user already saw keeps its reason even if the user caught it and returned.
    """
    intr = run.interrupt_info()
    if intr is not None and (intr.cancel or exc is not None):
        msg = cancel_message(intr.reason, intr.detail, intr.decided_by)
        status = REASON_STATUS[intr.reason]
        return run.snapshot(status, intr.reason, msg, intr.decided_by), True
    if run.stopped is not None:
        d, by = run.stopped
        return run.snapshot(
            d.status or Status.FAILED, d.reason or Reason.ERROR, d.message, by
        ), True
    if exc is None:
        missing = _missing_evidence(run)
        if missing:
            msg = "missing evidence: " + ", ".join(missing)
            return run.snapshot(Status.DEGRADED, Reason.MISSING_EVIDENCE, msg, DecidedBy.SDK), False
        return run.snapshot(
            Status.COMPLETED, Reason.FINAL_ANSWER, "final answer", DecidedBy.SDK
        ), False
    if isinstance(exc, RunStopped):
        # A sub-agent's stop escaping into this run: the same stop, seen one level up.
        o = exc.outcome
        msg = f"sub-agent run {o.run_id} stopped: {o.message}"
        return run.snapshot(o.status, o.reason, msg, o.decided_by), True
    if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt):
        msg = f"cancelled from outside the run ({type(exc).__name__})"
        return run.snapshot(Status.CANCELLED, Reason.USER_CANCEL, msg, DecidedBy.SDK), False
    reason = classify_exception(exc)
    msg = f"{reason.value}: {type(exc).__name__}"  # never the exception text: it may be raw data
    return run.snapshot(Status.FAILED, reason, msg, DecidedBy.SDK), False


def _missing_evidence(run: LiveRun) -> list[str]:
    out = []
    for name in run.require_evidence:
        ok = run.evidence_seen.get(name)
        if ok is None:
            out.append(name)
        elif not ok:
            out.append(f"{name} (failed)")
    return out


def cancel_message(reason: Reason, detail: str, by: DecidedBy = DecidedBy.SDK) -> str:
    """The outcome message of an interrupt: a cancel, a guard stop, or the deadline timer."""
    if reason is Reason.DEADLINE and by is DecidedBy.SDK:
        return detail  # already "deadline_s 90 reached (elapsed_s=90.001)"
    if reason in (Reason.USER_CANCEL, Reason.OPERATOR_CANCEL):
        head = f"cancelled: {reason.value}"
    else:
        head = f"stopped by the {by.value}: {reason.value}"
    return head + (f" ({detail})" if detail else "")


def outcome_attrs(outcome: Outcome) -> dict[str, Any]:
    """End attributes of the run span."""
    attrs: dict[str, Any] = {
        A.STOP_STATUS: outcome.status.value,
        A.STOP_REASON: outcome.reason.value,
        A.USAGE_STEPS: outcome.steps,
        A.USAGE_TOOL_CALLS: outcome.tool_calls,
    }
    if outcome.cost_usd is not None:
        attrs[A.COST_USD] = outcome.cost_usd
    return attrs
