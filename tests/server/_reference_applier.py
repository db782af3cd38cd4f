"""A plain reference for :class:`guard.server.applier._applier.SpanApplier`: span by span, no batching.

The fused loop inlines the three common kinds, caches the last run and its tenant's usage
between consecutive spans, and adds each run's tool calls to its budget once per request.
This version does none of that: every span is resolved to its run from scratch, and every
counted span is recorded in the run's budget at once. What a request means is the same: a
span counts for the run it names (or that owns its trace), never for another tenant's run;
the request's usage reaches each tenant's windows once, and each run it touched is decided
once at its end (``SpanApplier.conclude``, shared: it is *what* the guard decides, not how
spans are applied).

One difference that the generated traffic keeps away from: a provisional run that learns
its tenant from a later span (``Rejoin._set_tenant``) while the fused loop still holds it
as its current run does not add an (empty) entry for the new tenant to the request's usage.
"""

from __future__ import annotations

from typing import Any

from guard.policy import Phase, Usage
from guard.server.applier._applier import SpanApplier, Touched
from guard.server.decode._schema import (
    ACTION_FP,
    ATTEMPTS,
    CACHED,
    COST,
    FOREIGN,
    IN,
    KIND,
    KIND_MODEL,
    KIND_RUN,
    KIND_STEP,
    KIND_TOOL,
    MODEL,
    OUT,
    PROGRESS,
    REASONING,
    RESP_ID,
    RESULT_HASH,
    RUN_ID,
    STATE_HASH,
    STEP_INDEX,
    TOOL_NAME,
    TRACE_ID,
)

__all__ = ["ReferenceApplier"]

_RANK = {"continue": 0, "warn": 1, "wrap_up": 2, "stop": 3}


class _Refused(Exception):
    """The span is refused (counted in the request's rejections, with its reason)."""


class ReferenceApplier(SpanApplier):
    """Drop-in for ``registry.applier``: same results, obviously, one span at a time."""

    def ingest(self, decoded: Any, principal: Any) -> tuple[int, list[str]]:
        reg = self.registry
        reg.stats["spans"] += decoded.spans
        reg.stats["observations"] += len(decoded.observations)
        rejected = 0
        errors = list(decoded.errors)
        touched: dict[Any, Touched] = {}
        spent: dict[str, Usage] = {}

        def refuse(text: str) -> None:
            nonlocal rejected
            rejected += 1
            if len(errors) < 5:
                errors.append(text)

        for o in decoded.observations:
            run = self._run_of(o, principal, spent, refuse)
            if run is None:
                continue
            spent.setdefault(run.tenant, Usage())
            if run.seq_gate is not None and o[KIND] != KIND_RUN and reg.gate(run, o):
                continue
            try:
                counted = self._apply(run, o, spent[run.tenant])
            except _Refused as exc:
                refuse(str(exc))
                continue
            if counted is None:
                continue
            phase, verdict = counted
            entry = touched.get(run)
            if entry is None:
                entry = touched[run] = Touched(phase, None, 0, 0)
            entry.phase = phase
            if verdict is not None and (
                entry.verdict is None
                or _RANK[verdict.level.value] > _RANK[entry.verdict.level.value]
            ):
                entry.verdict = verdict
        reg.stats["rejected_spans"] += rejected
        self.conclude(touched, spent)
        return decoded.rejected + rejected, errors

    def _run_of(self, o: Any, principal: Any, spent: dict[str, Usage], refuse: Any) -> Any:
        """The run this span counts for, or None (dropped, or refused via ``refuse``)."""
        reg = self.registry
        run_id = o[RUN_ID]
        if run_id:
            run = reg.runs.get(run_id)
            if run is None:
                if run_id in reg.ended:
                    reg.stats["late_spans"] += 1
                    reg.budgets.late_span(o, principal.tenant, spent)
                    return None
                if o[KIND] == KIND_RUN:
                    return None
                run = self._implicit(o, principal)
                if run is None:
                    refuse(f"run {run_id[:64]!r}: not admitted (capacity/tenant)")
                    return None
        else:
            run = reg.by_trace.get(o[TRACE_ID])
            if run is None:
                return None
        if principal.tenant is not None and run.tenant != principal.tenant:
            if run_id and self._foreign_refused(o, principal):
                refuse(f"run {run_id[:64]!r}: not admitted (capacity/tenant)")
            return None
        return run

    def _apply(self, run: Any, o: Any, usage: Usage) -> tuple[Phase, Any] | None:
        """Count one span; its (phase, loop verdict), or None when it counts for nothing that
        is decided (a repeated model call, a run span). Raises _Refused."""
        kind = o[KIND]
        if kind == KIND_TOOL:
            attempts = o[ATTEMPTS] or 1
            run.budget.record_tool_calls(1, attempts=attempts)
            usage.tool_calls += 1
            usage.tool_attempts += attempts
            run.step_tools += 1
            if o[TOOL_NAME]:
                run.last_tool = o[TOOL_NAME]
            verdict = None
            if o[ACTION_FP]:
                run.last_action_hash = o[ACTION_FP]
                try:
                    verdict = run.detector.observe_action(o[ACTION_FP], o[RESULT_HASH])
                except ValueError as exc:
                    raise _Refused(str(exc)) from None
            return Phase.AFTER_TOOL_BATCH, verdict
        if kind == KIND_STEP:
            try:
                run.budget.record_step()
                usage.steps += 1
                verdict = run.detector.end_step(
                    state=o[STATE_HASH], progress=o[PROGRESS], acted=run.step_tools > 0
                )
                index = o[STEP_INDEX] or run.budget.usage().steps
                run.forecaster.observe(index, run.step_input_tokens)
            except ValueError as exc:
                raise _Refused(str(exc)) from None
            run.step_input_tokens = 0
            run.last_step_tokens, run.step_tokens = run.step_tokens, 0
            run.last_step_cost, run.step_cost = run.step_cost, 0.0
            run.step_tools = 0
            run.last_step = index
            return Phase.BEFORE_STEP, verdict
        if kind == KIND_MODEL:
            if (o[FOREIGN] or o[RESP_ID] or run.seen is not None) and self._duplicate(run, o):
                return None
            cost = o[COST]
            try:
                if cost is None and o[MODEL]:
                    cost = self.registry.config.prices.cost_usd(
                        o[MODEL], input_tokens=o[IN], output_tokens=o[OUT], cached_tokens=o[CACHED]
                    )
                run.budget.record_model_call(
                    input_tokens=o[IN],
                    output_tokens=o[OUT],
                    reasoning_tokens=o[REASONING],
                    cached_tokens=o[CACHED],
                    cost_usd=cost,
                )
            except ValueError as exc:
                raise _Refused(str(exc)) from None
            run.step_input_tokens += o[IN]
            run.step_tokens += o[IN] + o[OUT]
            run.gate_tokens += o[IN] + o[OUT]
            if cost is not None:
                run.step_cost += cost
                run.gate_cost_usd += cost
                usage.cost_usd = (usage.cost_usd or 0.0) + cost
            if o[MODEL]:
                run.model = o[MODEL]
            usage.model_calls += 1
            usage.input_tokens += o[IN]
            usage.output_tokens += o[OUT]
            usage.reasoning_tokens += o[REASONING]
            usage.cached_tokens += o[CACHED]
            return Phase.AFTER_MODEL_CALL, None
        self._run_span(run, o)
        return None
