"""Third-party GenAI spans (from instrumentations, not the SDK) counted in-process, once.

:class:`ForeignSpans` is the SDK's span processor on the TracerProvider that instrumentations
write to (OpenLLMetry, OpenInference, OpenLIT, Pydantic AI, a framework's own). A span started
inside a guarded run (the run and step of the context it starts in) and ending as

* a **model call** (usage under any spelling of :data:`guard.semconv.USAGE_ATTRIBUTES`, not an
  aggregate operation) is counted into the run: tokens, cost from the price book, the policy
  after the call (a stop is pending, raised at the run's next SDK call: never from inside the
  instrumentation's ``span.end()``), the reservation of its context settled. So its usage is in
  ``RunStopped.outcome`` and the termination record;
* a **tool call** (``execute_tool``, ``gen_ai.tool.name``, OpenInference ``TOOL``) is recorded
  like ``step.tool_call``: its arguments and result, read from the span, fingerprinted with the
  run's HMAC key and canonicalisation, feed loop detection.

Each call is counted once however many report it. A model span is a *duplicate* when it is
the parent of a counted span (a wrapper reporting the aggregate), or when the step already
recorded the same call explicitly (``step.model_call`` with the same response id, or with the
same input and output tokens when either side has no response id: OpenInference spans have
none). The other way round, ``step.model_call`` after a counted span of the same call in its
step *claims* it (:meth:`CallLedger.claim`) and records nothing more. A tool span is a
duplicate when ``@guard.tool`` / ``step.tool_call`` recorded that tool while it was open.

The guard agrees because of what reaches it (the export to the guard is chained behind this
processor): a counted span goes out *stamped* as the run's own call (``guard.run.id``,
``guard.seq``, ``guard.cost.usd``; a tool span also ``gen_ai.operation.name=execute_tool``,
``guard.action.fingerprint``, ``guard.result.hash``), so the guard counts it as the SDK's
span, once; a duplicate model span goes out without its token counters. The copy is the guard's only: the
application's own processors see the span as the instrumentation wrote it, and the redaction
further down still drops every raw argument and result.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.trace import StatusCode

from guard import semconv as A
from guard.policy import Phase
from guard.sdk._calls import MISSING, record_tool_call
from guard.sdk._foreign_calls import CallLedger, RunCalls, calls_of, native_tools, note_integrated
from guard.sdk._implicit import note_call
from guard.sdk._redact import copy_span
from guard.sdk._reserve import current_reservation
from guard.sdk._run import _current as _current_run
from guard.sdk._step import current_step
from guard.semconv import (
    AGGREGATE_OPERATIONS,
    MODEL_OPERATIONS,
    TOOL_ARGUMENTS,
    TOOL_RESULTS,
    TOOL_SPAN_KINDS,
    USAGE_ATTRIBUTES,
)

if TYPE_CHECKING:  # pragma: no cover
    from guard.sdk._run import LiveRun
    from guard.sdk._runtime import Runtime
    from guard.sdk._step import Step

__all__ = [
    "COUNTED_KEY",
    "CallLedger",
    "ForeignSpans",
    "RunCalls",
    "note_integrated",
    "stamped",
]

log = logging.getLogger("guard.sdk")

_AFTER_MODEL = Phase.AFTER_MODEL_CALL
_current_run_get = _current_run.get
_OWNERS_MAX = 65_536  # open third-party spans tracked at once (a leak is forgotten, not grown)
_TOKENS = ("input_tokens", "output_tokens", "cache_read_tokens", "reasoning_tokens")
_USAGE = tuple((f, USAGE_ATTRIBUTES[f]) for f in _TOKENS)
_ATTR = {f: USAGE_ATTRIBUTES[f] for f in ("model", "response_model", "response_id", "operation")}
_TOOL_NAME_KEYS = USAGE_ATTRIBUTES["tool_name"]
_TOOL_MARKS = USAGE_ATTRIBUTES["tool_name"][:2]  # a span naming a tool is a tool call
_TOKEN_KEYS = frozenset(k for f in (*_TOKENS, "cache_write_tokens") for k in USAGE_ATTRIBUTES[f])
_TOOL_ID_KEYS = USAGE_ATTRIBUTES["tool_call_id"]


def _first(attrs: Any, keys: tuple[str, ...]) -> Any:
    for k in keys:
        v = attrs.get(k)
        if v is not None:
            return v
    return None


# Set in the OpenTelemetry context by an integration (guard.integrations._base) while the
# model call it counts itself is in flight, or around a framework's node that runs one: a
# third-party model span started under it is that call, already counted.
COUNTED_KEY = "otel_guard.counted"


class _Owner:
    """The run and step a third-party span started in; tool spans also the run's own tool
    count then (a ``@guard.tool`` recorded while the span was open makes it a duplicate);
    ``counted``: it started under an integration's :data:`COUNTED_KEY`."""

    __slots__ = ("counted", "run", "step", "tools")

    def __init__(self, run: LiveRun, step: Step | None, tools: int | None, counted: bool) -> None:
        self.run = run
        self.step = step
        self.tools = tools
        self.counted = counted


def _is_tool(name: str, attrs: Any) -> bool:
    op = attrs.get(A.OPERATION)
    if op in MODEL_OPERATIONS or attrs.get("openinference.span.kind") == "LLM":
        return False  # a model call, whatever tool it names
    return (
        op == A.EXECUTE_TOOL
        or name.startswith(A.EXECUTE_TOOL)
        or any(attrs.get(k) == v for k, v in TOOL_SPAN_KINDS.items())
        or _first(attrs, _TOOL_MARKS) is not None
    )


def _parsed(value: Any) -> Any:
    """A JSON text as its structure (so canonicalisation sees keys and values), else as is."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except ValueError:
            pass
    return value


def stamped(span: ReadableSpan, extra: dict[str, Any] | None) -> ReadableSpan:
    """A copy of an ended span for the guard's export only: with ``extra`` attributes added,
    or (``None``) without its token counters (a call counted from another span)."""
    attrs = span.attributes or {}
    if extra is None:
        attrs = {k: v for k, v in attrs.items() if k not in _TOKEN_KEYS}
    else:
        attrs = {**attrs, **extra}
    return copy_span(span, attrs)


class ForeignSpans(SpanProcessor):
    """Counts third-party spans of guarded runs (module doc); forwards every span, stamped or
    dropped as it says, to ``forward`` (the export to the guard), when there is one.

    Counters: ``model_calls`` and ``tool_calls`` counted, ``duplicates`` not counted again,
    ``errors`` (a span that could not be counted: logged, never raised).
    """

    def __init__(self, rt: Runtime, forward: SpanProcessor | None = None) -> None:
        self._rt = rt
        # our own spans (the SDK Tracer's one scope object on each of them): skipped at once
        self._scope = getattr(rt.tracer, "_instrumentation_scope", None)
        self._forward = forward
        self._owners: dict[int, _Owner] = {}
        self._relay: Any = None  # while no span was owned: see bind_relay
        self.model_calls = 0
        self.tool_calls = 0
        self.duplicates = 0
        self.errors = 0

    def bind_relay(self, relay: Any) -> None:
        """Called by the relay that points here. Until the first third-party span of a run is
        owned, on_end would only forward: the relay calls the forward directly (a Python call
        less per span), and on_start routes ended spans here before it owns one."""
        self._relay = relay
        relay.route_ends(self, self._forward.on_end if self._forward is not None else id)

    # SpanProcessor interface ---------------------------------------------------------------
    def on_start(self, span: Any, parent_context: Any = None) -> None:
        # every span of the provider comes here: the cheapest tests first (outside a run one
        # context-variable read; our own spans one identity test more)
        run = _current_run_get()
        if run is None or span._instrumentation_scope is self._scope:
            return
        if run.rt is not self._rt or not run.live:
            return
        step = current_step()
        if step is not None and (step.run is not run or step.span is None):
            step = None
        attrs = span.attributes or {}
        tools = native_tools(run) if _is_tool(span.name, attrs) else None
        if step is not None and step.calls is None:
            step.calls = CallLedger()  # steps with a third-party span keep a ledger
        if len(self._owners) >= _OWNERS_MAX:
            self._owners.clear()
        counted = otel_context.get_value(COUNTED_KEY, parent_context) is True
        relay = self._relay
        if relay is not None:  # routed here first, then forgotten (a racing start routes too)
            relay.route_ends(self, self.on_end)
            self._relay = None
        self._owners[span.context.span_id] = _Owner(run, step, tools, counted)

    def on_end(self, span: ReadableSpan) -> None:
        out = span
        if self._owners and span._instrumentation_scope is not self._scope:
            # an ended span has its context
            owner = self._owners.pop(span._context.span_id, None)  # type: ignore[union-attr]
            if owner is not None and owner.run.live:
                try:
                    out = self._count(span, owner)
                except Exception:
                    self.errors += 1
                    log.warning("otel-guard: could not count span %r", span.name, exc_info=True)
        if self._forward is not None:
            self._forward.on_end(out)

    def shutdown(self) -> None:
        if self._forward is not None:
            self._forward.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._forward.force_flush(timeout_millis) if self._forward is not None else True

    # counting ----------------------------------------------------------------------------------
    def _count(self, span: ReadableSpan, owner: _Owner) -> ReadableSpan:
        attrs = span.attributes or {}
        if owner.tools is not None or _is_tool(span.name, attrs):
            return self._tool(span, attrs, owner)
        usage = {f: _first(attrs, keys) for f, keys in _USAGE}
        if usage["input_tokens"] is None and usage["output_tokens"] is None:
            return span  # not a model call (HTTP, DB, a chain): the guard's filters decide
        info = {f: _first(attrs, keys) for f, keys in _ATTR.items()}
        if info["operation"] in AGGREGATE_OPERATIONS:
            return span  # an agent / workflow total: its calls count on their own spans
        return self._model(span, usage, info, owner)

    def _model(
        self, span: ReadableSpan, usage: dict[str, Any], info: dict[str, Any], owner: _Owner
    ) -> ReadableSpan:
        run, step = owner.run, owner.step
        inp, out, cached, reasoning = (_count_of(usage[f]) for f in _TOKENS)
        cached = min(cached, inp)
        reasoning = min(reasoning, out)
        response_id = info["response_id"] if isinstance(info["response_id"], str) else None
        span_id = span.context.span_id
        parent_id = span.parent.span_id if span.parent is not None else 0
        calls = calls_of(run)
        ledger = step.calls if step is not None else None
        if (
            owner.counted
            or span_id in calls.parents
            or (parent_id and parent_id in calls.spans)
            or (ledger is not None and ledger.matches_recorded(response_id, inp, out))
            or (calls.integrated and calls.take_integrated(response_id, inp, out))
        ):
            self.duplicates += 1
            return stamped(span, None)  # the guard counts the call once, from the other span
        model = info["model"] or info["response_model"] or ""
        rt = run.rt
        cost = (
            rt.cost_usd(model, input_tokens=inp, output_tokens=out, cached_tokens=cached)
            if model
            else None
        )
        sres = current_reservation.get() or (step._implicit if step is not None else None)
        settles = sres.take() if sres is not None and sres.run is run else None
        seq, d = run.budget.model_call_escalation(
            inp, out, reasoning, cached, cost, run.soft_rank, settles
        )
        self.model_calls += 1
        calls.add(span_id, parent_id)
        if ledger is not None:
            ledger.counted.append((response_id, inp, out, cost))
        if step is not None:
            note_call(step, cost, inp + out)  # the step's spend: the run's mean per step
        run.did_work = True
        # a stop is raised at the run's next SDK call (a span processor never raises)
        run.after_call(_AFTER_MODEL, d, spent=(cost, inp + out) if settles is None else None)
        extra: dict[str, Any] = {A.RUN_ID: run.run_id}
        if run.numbered:
            extra[A.SEQ] = seq
        if cost is not None:
            extra[A.COST_USD] = cost
        return stamped(span, extra)

    def _tool(self, span: ReadableSpan, attrs: Any, owner: _Owner) -> ReadableSpan:
        run, step = owner.run, owner.step
        name = _first(attrs, _TOOL_NAME_KEYS)
        if not isinstance(name, str) or not name:
            head = A.EXECUTE_TOOL + " "
            name = span.name[len(head) :] if span.name.startswith(head) else span.name
        calls = calls_of(run)
        span_id = span.context.span_id
        if span_id in calls.tool_parents or (
            owner.tools is not None and native_tools(run) > owner.tools and run.last_tool == name
        ):
            # a tool span inside it was counted, or @guard.tool recorded it while it was open:
            # it goes out as it is (no usage, no run id: the guard does not count it)
            self.duplicates += 1
            return span
        args = _first(attrs, TOOL_ARGUMENTS)
        result = _first(attrs, TOOL_RESULTS)
        result = MISSING if result is None else _parsed(result)
        if result is MISSING and span.status.status_code is StatusCode.ERROR:
            result = {"error": attrs.get(A.ERROR_TYPE) or "error"}
        call_id = _first(attrs, _TOOL_ID_KEYS)
        extra: dict[str, Any] = {}
        calls.tools += 1  # first: a count in between never looks like a call of the run's own
        record_tool_call(
            run,
            run.ctx,
            step,
            name,
            _parsed(args),
            result,
            call_id=call_id if isinstance(call_id, str) else None,
            span_attrs=extra,
        )
        self.tool_calls += 1
        calls.add(span_id, span.parent.span_id if span.parent is not None else 0, tool=True)
        if step is not None and step.span is not None:
            step.tool_calls += 1
        return stamped(span, extra)

    def counters(self) -> dict[str, int]:
        return {
            "foreign_model_calls": self.model_calls,
            "foreign_tool_calls": self.tool_calls,
            "foreign_duplicates": self.duplicates,
            "foreign_errors": self.errors,
        }


def _count_of(value: Any) -> int:
    """A token counter from a span: a non-negative int (bools, floats with a fraction, text
    and negatives count as 0; the guard refuses such a span on its side)."""
    if type(value) is int and value > 0:
        return value
    if type(value) is float and value > 0 and value.is_integer():
        return int(value)
    return 0
