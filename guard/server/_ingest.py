"""The span path: apply decoded observations to runs, then let the policy decide.

Mixed into :class:`guard.server._registry.Registry`. Order per the span contract: model span
-> record usage, decide(AFTER_MODEL_CALL); tool span -> record the call, loop.observe_action,
decide(AFTER_TOOL_BATCH); step span -> record_step, loop.end_step, decide(BEFORE_STEP) and the
forecast; run span -> nothing while the agent's stream is up (RunEnded carries the outcome),
else its stop attributes end the run.

Foreign GenAI spans (no ``guard.run.id``) count for the run that owns their trace. A model
call is counted once: see ``SeenCalls`` for the three ways a duplicate is recognised.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from guard.policy import DecidedBy, Phase, Reason, Status, Usage
from guard.server._decode import KIND_MODEL, KIND_RUN, KIND_STEP, KIND_TOOL

if TYPE_CHECKING:  # pragma: no cover
    from guard.server._auth import Principal
    from guard.server._decode import Decoded, Observation
    from guard.server._state import RunState

__all__ = ["Ingest"]

_AFTER_MODEL = Phase.AFTER_MODEL_CALL
_AFTER_TOOLS = Phase.AFTER_TOOL_BATCH
_BEFORE_STEP = Phase.BEFORE_STEP


class Ingest:
    """Span ingestion (mixin; expects the Registry's attributes)."""

    runs: dict[str, RunState]
    by_trace: dict[bytes, RunState]
    ended: Any
    stats: dict[str, int]
    tenants: Any
    config: Any
    max_runs: int

    def ingest(self, decoded: Decoded, principal: Principal) -> tuple[int, list[str]]:
        """Apply one request's observations. Returns (rejected spans, first error texts)."""
        stats = self.stats
        stats["spans"] += decoded.spans
        stats["observations"] += len(decoded.observations)
        rejected = decoded.rejected
        errors = decoded.errors
        runs_get = self.runs.get
        trace_get = self.by_trace.get
        scope = principal.tenant
        for o in decoded.observations:
            if o.run_id:
                run = runs_get(o.run_id)
                if run is None:
                    if o.run_id in self.ended:
                        stats["late_spans"] += 1
                        continue
                    if o.kind == KIND_RUN:
                        continue  # the end of a run we never tracked: nothing to decide
                    run = self._implicit(o, principal)
                    if run is None:
                        rejected += 1
                        if len(errors) < 5:
                            errors.append(
                                f"run {o.run_id[:64]!r}: guard at capacity "
                                f"({len(self.runs)} tracked runs)"
                            )
                        continue
            else:
                run = trace_get(o.trace_id)
                if run is None:
                    continue  # a GenAI span outside any guarded run: not ours to count
            if scope is not None and run.tenant != scope:
                rejected += 1
                if len(errors) < 5:
                    errors.append(f"run {o.run_id[:64]!r} belongs to another tenant")
                continue
            kind = o.kind
            try:
                if kind == KIND_MODEL:
                    self._model(run, o)
                elif kind == KIND_TOOL:
                    self._tool(run, o)
                elif kind == KIND_STEP:
                    self._step(run, o)
                else:
                    self._run_span(run, o)
            except ValueError as exc:  # InvalidInput from the budget: the span is refused
                rejected += 1
                if len(errors) < 5:
                    errors.append(str(exc))
        stats["rejected_spans"] += rejected - decoded.rejected
        return rejected, errors

    def _implicit(self, o: Observation, principal: Principal) -> RunState | None:
        """A span of a run that never said RunStarted: track it from its spans alone."""
        if len(self.runs) >= self.max_runs and not self._make_room():
            self.stats["capacity_rejections"] += 1
            return None
        tenant = o.tenant or (principal.tenant or "")
        if principal.tenant is not None and tenant != principal.tenant:
            return None
        return self._new_run(
            o.run_id,
            tenant=tenant,
            agent=o.agent,
            parent_run_id=o.parent_run_id,
            trace=o.trace_id,
            started_at=0.0,
            limits=self.config.effective_limits(None),
            session=None,
            admitted=False,
        )

    def _model(self, run: RunState, o: Observation) -> None:
        seen = run.seen
        if o.foreign or o.response_id or seen is not None:
            seen = run.seen_calls()
            if seen.duplicate(o.span_id, o.parent_span_id, o.response_id):
                self.stats["duplicate_model_calls"] += 1
                return
            seen.add(o.span_id, o.parent_span_id if o.foreign else b"", o.response_id)
            if o.foreign:
                self.stats["foreign_model_calls"] += 1
        cost = o.cost_usd
        if cost is None and o.model:
            cost = self.config.prices.cost_usd(
                o.model,
                input_tokens=o.input_tokens,
                output_tokens=o.output_tokens,
                cached_tokens=o.cached_tokens,
            )
        budget = run.budget
        budget.record_model_call(
            input_tokens=o.input_tokens,
            output_tokens=o.output_tokens,
            reasoning_tokens=o.reasoning_tokens,
            cached_tokens=o.cached_tokens,
            cost_usd=cost,
        )
        run.step_input_tokens += o.input_tokens
        if o.model:
            run.model = o.model
        td = self.tenants.record(
            run.tenant,
            Usage(
                model_calls=1,
                input_tokens=o.input_tokens,
                output_tokens=o.output_tokens,
                reasoning_tokens=o.reasoning_tokens,
                cached_tokens=o.cached_tokens,
                cost_usd=cost,
            ),
        )
        if td.stop:
            self.tenant_cut(run.tenant, td)
        self._decide(run, _AFTER_MODEL, None)

    def _tool(self, run: RunState, o: Observation) -> None:
        attempts = o.attempts if o.attempts else 1
        run.budget.record_tool_calls(1, attempts=attempts)
        run.step_tools += 1
        if o.tool_name:
            run.last_tool = o.tool_name
        verdict = None
        if o.action_fp:
            run.last_action_hash = o.action_fp
            verdict = run.loop.observe_action(o.action_fp, o.result_hash)
        td = self.tenants.record(run.tenant, Usage(tool_calls=1, tool_attempts=attempts))
        if td.stop:
            self.tenant_cut(run.tenant, td)
        self._decide(run, _AFTER_TOOLS, verdict)

    def _step(self, run: RunState, o: Observation) -> None:
        run.budget.record_step()
        verdict = run.loop.end_step(
            state=o.state_hash, progress=o.progress, acted=run.step_tools > 0
        )
        index = o.step_index or run.budget.usage().steps
        run.forecaster.observe(index, run.step_input_tokens)
        run.step_input_tokens = 0
        run.step_tools = 0
        td = self.tenants.record(run.tenant, Usage(steps=1))
        if td.stop:
            self.tenant_cut(run.tenant, td)
        self._decide(run, _BEFORE_STEP, verdict)
        if run.stop_reason is None:
            self.forecast(run, index)

    def _decide(self, run: RunState, phase: Phase, verdict: Any) -> None:
        run.touched_at = self.clock()
        if run.stop_reason is None:
            self.act(run, run.budget.decide(phase=phase, loop=verdict), verdict)
        parent = run.parent
        while parent is not None:  # nested runs spend their parents' budgets too
            if parent.stop_reason is None and parent.run_id in self.runs:
                self.act(parent, parent.budget.decide(phase=phase))
            parent = parent.parent

    def _run_span(self, run: RunState, o: Observation) -> None:
        if run.connected:
            return  # RunEnded over the stream is the record
        try:
            status = Status(o.stop_status) if o.stop_status else Status.COMPLETED
            reason = Reason(o.stop_reason) if o.stop_reason else Reason.FINAL_ANSWER
        except ValueError:
            status, reason = Status.FAILED, Reason.ERROR
        if run.stop_by is not None and reason in (Reason.OPERATOR_CANCEL, run.stop_reason):
            by = run.stop_by
        else:
            by = DecidedBy.SDK
        self.end_run(run, status, reason, "from the run span (no control stream)", by)

    # provided by Registry / Decisions
    clock: Any
    act: Any
    forecast: Any
    tenant_cut: Any
    end_run: Any
    _new_run: Any
    _make_room: Any
