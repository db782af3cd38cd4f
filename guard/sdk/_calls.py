"""Recording model calls and tool calls: usage, fingerprints, spans and the after-call check."""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import SpanKind, Status, StatusCode

from guard import semconv as A
from guard.errors import BudgetExceeded
from guard.policy import Action, Decision, Phase, Reason
from guard.policy import Status as RunStatus
from guard.sdk._outcome import tag
from guard.sdk._polls import is_poll
from guard.sdk._reserve import budget_stop, tenant_check
from guard.sdk._tool_ledger import claim_invocation

if TYPE_CHECKING:  # pragma: no cover
    from guard.policy import Reservation
    from guard.sdk._run import LiveRun

__all__ = [
    "MISSING",
    "current_batch",
    "current_call",
    "emit_call_span",
    "provider_for",
    "record_tool_call",
    "reserve_tool",
]

MISSING: Any = object()  # "no result given" (None is a legitimate tool result)

# The tool batch whose reserved slots the tool calls of this context consume.
current_batch: contextvars.ContextVar[Any] = contextvars.ContextVar("guard_batch", default=None)
# The one call of a batch that ``run_tools`` runs in this context (its own slot, so a
# ``@guard.tool`` or ``step.tool_call`` inside it consumes that slot and nobody else's).
current_call: contextvars.ContextVar[Any] = contextvars.ContextVar("guard_call", default=None)
_ERROR = Status(StatusCode.ERROR)
_CLIENT, _INTERNAL = SpanKind.CLIENT, SpanKind.INTERNAL
_AFTER_TOOLS, _CONTINUE = Phase.AFTER_TOOL_BATCH, Action.CONTINUE
# Hot path (every tool call): module-level names instead of attribute lookups.
_OPERATION, _TOOL_NAME, _ACTION_FP = A.OPERATION, A.TOOL_NAME, A.ACTION_FP
_TOOL_ATTEMPTS, _RUN_ID, _RESULT_HASH, _SEQ = A.TOOL_ATTEMPTS, A.RUN_ID, A.RESULT_HASH, A.SEQ
_EXECUTE_TOOL_ = A.EXECUTE_TOOL + " "  # the span name's head


_PROVIDERS = (  # gen_ai.provider.name inferred from well-known model families
    (("gpt-", "o1", "o3", "o4", "chatgpt", "text-embedding"), "openai"),
    (("claude",), "anthropic"),
    (("gemini",), "gcp.gemini"),
    (("mistral", "codestral", "magistral"), "mistral_ai"),
    (("deepseek",), "deepseek"),
    (("grok",), "x_ai"),
)
_provider_cache: dict[str, str | None] = {}


def provider_for(model: str) -> str | None:
    """``gen_ai.provider.name`` for a model name (cached), or ``None``."""
    p = _provider_cache.get(model, MISSING)
    return _provider(model) if p is MISSING else p


def _provider(model: str) -> str | None:
    try:
        return _provider_cache[model]
    except KeyError:
        pass
    found = None
    low = model.lower()
    for prefixes, name in _PROVIDERS:
        if low.startswith(prefixes):
            found = name
            break
    if len(_provider_cache) < 4096:  # bounded: model names come from code, not users
        _provider_cache[model] = found
    return found


def emit_call_span(
    tracer: Any,
    name: str,
    parent_ctx: Any,
    kind: SpanKind,
    attrs: dict[str, Any],
    started_at: float | None,
    error: BaseException | None,
) -> None:
    """One finished model or tool call as a span (``started_at``: Unix seconds, else now)."""
    span = tracer.start_span(
        name,
        context=parent_ctx,
        kind=kind,
        attributes=attrs,
        start_time=None if started_at is None else int(started_at * 1e9),
    )
    if error is not None:
        span.set_status(_ERROR)
    span.end()


def reserve_tool(
    run: LiveRun, cost_usd: float | None = None, context: str = ""
) -> Reservation | None:
    """Admit one tool call before it runs (refuse new work; never oversell the quota).

    Uses a slot reserved by an enclosing tool batch when there is one. A paid tool
    (``cost_usd``) also reserves its price against the run, its ancestors and its tenant.
    Raises ``RunStopped`` (``max_tool_calls``, ``cost_budget``, ``tenant_budget``) when the
    call cannot be covered; ``context`` says where the price came from (an implicit estimate).
    """
    run.check_stop()
    batch = current_batch.get()
    if batch is not None and batch.run is run:
        slot = batch.take_slot()
        if slot is not None:
            return slot
    if not cost_usd and not _has_tool_limit(run):
        return None
    try:
        res = run.budget.reserve(tool_calls=1, cost_usd=cost_usd or 0.0)
    except BudgetExceeded as exc:
        if exc.metric != "tool_calls":
            budget_stop(run, exc, context)
        u = run.budget.usage()
        msg = f"max_tool_calls reached (tool_calls={u.tool_calls}, available={exc.available:g})"
        d = Decision(Action.STOP, RunStatus.TERMINATED, Reason.MAX_TOOL_CALLS, message=msg)
        run.apply(d, raise_now=True)
        raise  # pragma: no cover - apply raised
    if cost_usd:
        tenant_check(run, res.release)
    return res


def _has_tool_limit(run: LiveRun) -> bool:
    r: LiveRun | None = run
    while r is not None:
        if r.budget.limits.max_tool_calls is not None:
            return True
        r = r.parent
    return False


def record_tool_call(
    run: LiveRun,
    parent_ctx: Any,
    step: Any,
    name: str,
    args: Any,
    result: Any = MISSING,
    attempts: int = 1,
    cost_usd: float | None = None,
    error: BaseException | None = None,
    call_id: str | None = None,
    started_at: float | None = None,
    reservation: Reservation | None = None,
    span_attrs: dict[str, Any] | None = None,
    poll: bool = False,
) -> str:
    """Record one finished tool call; returns its action fingerprint.

    Only the HMAC fingerprint of ``args`` and the hash of ``result`` leave the process.
    ``span_attrs``: the call already has a span (a third-party tool span, ``_foreign``): its
    ``execute_tool`` attributes go into this dict instead of a span of ours.
    ``poll``: the call is a poll (so is a call of a tool declared one: ``guard.sdk._polls``):
    the poll rule judges it, not the loop detector, and its span carries no fingerprint.
    """
    fp = run.fp
    action = fp.action(name, args)
    inv = claim_invocation(run)  # a @guard.tool inside a framework's tool: that call
    if inv is not None and not call_id:
        call_id = inv.call_id
    run.tool_ledger.recorded(call_id, name, action)
    result_hash = None if result is MISSING else fp.result(result)
    if error is not None and result_hash is None:
        # A failure is an observation too: the same error again is "no new information".
        result_hash = fp.result({"error": type(error).__qualname__})
    batch = current_batch.get()
    in_batch = batch is not None and batch.run is run
    if in_batch:
        if reservation is None:
            reservation = batch.take_slot()  # a call recorded by hand inside an admitted batch
        batch.note_recorded(action)
    # The common case (no batch, no reservation, plain arguments that cannot fail validation):
    # recorded and decided under one lock after the loop detector. Otherwise recorded first
    # (an invalid argument raises before anything is observed).
    quick = (
        not in_batch
        and reservation is None
        and cost_usd is None
        and type(attempts) is int
        and attempts >= 0
    )
    seq = 0
    if not quick:
        seq = run.budget.record_tool_calls(1, attempts=attempts, cost_usd=cost_usd)
        if cost_usd is not None:  # the tool's mean cost per call (implicit estimates)
            run.means.add_tool(name, cost_usd)
        if reservation is not None:
            reservation.release()  # after recording: the slot is never free twice
    poll = poll or is_poll(run, name)
    if poll:
        verdict = run.observe_poll(name, action, result_hash, error is None)
    else:
        verdict = run.observe_action(name, action, result_hash, error is None)
    loop = verdict if verdict.level is not _CONTINUE else None
    d = None
    if quick:
        seq, d = run.budget.tool_call_escalation(attempts, None, loop, run.soft.rank)
    if step is not None and not poll:
        step.action = action  # the step span carries the last tool call's fingerprint
    attrs: dict[str, Any] = {
        _OPERATION: A.EXECUTE_TOOL,
        _TOOL_NAME: name,
        _ACTION_FP: action,
        _TOOL_ATTEMPTS: attempts,
        _RUN_ID: run.run_id,
    }
    if poll:
        # No fingerprint: the guard counts the call without feeding its loop detector (whose
        # repeat patterns would stop a declared poll at its third unchanged answer).
        del attrs[_ACTION_FP]
        attrs[A.TOOL_POLL] = True
    if run.numbered:
        attrs[_SEQ] = seq
    if call_id:
        attrs[A.TOOL_CALL_ID] = call_id
    if result_hash is not None:
        attrs[_RESULT_HASH] = result_hash
    if cost_usd is not None:
        attrs[A.COST_USD] = cost_usd
    if error is not None:
        attrs[A.ERROR_TYPE] = type(error).__qualname__
        tag(error, "tool")
    if span_attrs is not None:
        span_attrs.update(attrs)
    elif started_at is None and error is None:  # emit_call_span's usual case, inline
        run.rt.tracer.start_span(
            _EXECUTE_TOOL_ + name, context=parent_ctx, kind=_INTERNAL, attributes=attrs
        ).end()
    else:
        emit_call_span(
            run.rt.tracer, _EXECUTE_TOOL_ + name, parent_ctx, _INTERNAL, attrs, started_at, error
        )
    if in_batch:
        batch.note_verdict(verdict)  # decided once, when the batch closes
    else:
        if not quick:
            d = run.decide_after(_AFTER_TOOLS, loop)
        if d is not None or run.parent is not None:  # else after_call has nothing to do
            run.after_call(_AFTER_TOOLS, d)
    return action
