"""The span path: apply decoded observations to runs, then let the policy decide.

A part of :class:`guard.server.runs._registry.Registry` (``registry.applier``), reaching the runs
and the other parts through the narrow :class:`SpanHost`. Per the span contract: a model span
records usage (AFTER_MODEL_CALL); a tool span records the call and feeds
``loop.observe_action`` (AFTER_TOOL_BATCH); a step span records the step, feeds
``loop.end_step`` and the forecaster (BEFORE_STEP); a run span does nothing while the
agent's stream is up (RunEnded carries the outcome), else its stop attributes end the run.

Batching (the issue's "batch work per request"): usage is recorded span by span, except tool
calls, which are added to each run's budget once per run per request (their counts only add
up and nothing reads them before the decision; the loop detector still sees every call, in
order). Each run touched by a request is *decided* once, after all of that request's spans
for it and after its tool calls are recorded, with the phase of its last span and the
strongest loop verdict it produced; tenant usage is summed per request and added to the
rolling windows once. Limits only grow tighter as usage grows, so this finds the same stops;
it saves one policy evaluation per span. With the SDK's low-latency export a request usually
holds one step, so decisions stay per step. The hot path (tool, model and step spans) is
inlined in ``ingest``: this loop runs once per span.

Foreign GenAI spans (no ``guard.run.id``) count for the run that owns their trace. A model
call is counted once: see ``SeenCalls`` for the three ways a duplicate is recognised.

The native applier (``_applynative.c``, see :mod:`guard.server.applier._nativeapply`) runs this loop
for the spans it answers for (tool, step and model spans of tracked runs of the caller's
tenant, and run spans of connected runs), the loop below for the rest, and the request's end
for the runs the decision may act on; ``SpanApplier(native=False)`` and
``OTEL_GUARD_PURE_PYTHON=1`` keep to the Python loop, the reference it is tested against
(tests/server/test_applier_native.py). The rarer cases are in :mod:`guard.server.applier._edge`.

Numbered spans (``guard.seq``, set by the SDK when the run has a control stream) are counted
once across a guard restart: see ``Rejoin.gate``. The span path never writes the record of a run
whose agent has a control stream; the agent's RunEnded is the record (``_run_span``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from guard.errors import InvalidInput
from guard.policy import Phase, Usage
from guard.server.applier._edge import SpanEdges
from guard.server.applier._host import SpanHost, Touched
from guard.server.applier._host import flush as _flush
from guard.server.applier._nativeapply import applier
from guard.server.decisions._router import _forecast_due
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

if TYPE_CHECKING:  # pragma: no cover
    from guard.server.decode._schema import Decoded, Observation
    from guard.server.runs._state import RunState
    from guard.server.runtime._auth import Principal

__all__ = ["SpanApplier", "SpanHost", "Touched"]  # SpanHost, Touched: see _spanhost

_AFTER_MODEL = Phase.AFTER_MODEL_CALL
_AFTER_TOOLS = Phase.AFTER_TOOL_BATCH
_BEFORE_STEP = Phase.BEFORE_STEP


class SpanApplier(SpanEdges):
    """Applies decoded observations to the registry's runs: the fused ingest loop.

    One per registry (``registry.applier``); it owns no state of its own beyond a request
    (kept in :class:`Touched` and a tenant -> :class:`~guard.policy.Usage` map) and reaches
    the runs, the tenants' budgets and the decision routing through its :class:`SpanHost`.
    """

    def __init__(self, registry: SpanHost, *, native: bool = True) -> None:
        self.registry = registry
        # The native loop (_nativeapply) when built and on; ``native=False``: this Python
        # loop alone (the reference the native one is tested against).
        self.native = native

    def ingest(self, decoded: Decoded, principal: Principal) -> tuple[int, list[str]]:
        """Apply one request's observations. Returns (rejected spans, first error texts)."""
        reg = self.registry
        stats = reg.stats
        stats["spans"] += decoded.spans
        obs = decoded.observations
        n = len(obs)
        stats["observations"] += n
        touched: dict[RunState, Touched] = {}  # run -> what this request did to it
        spent: dict[str, Usage] = {}  # tenant -> summed usage
        errors = decoded.errors
        native = applier() if self.native else None
        if native is None:
            rejected = self._apply(obs, 0, n, touched, spent, principal, decoded.rejected, errors)
        else:
            # The native loop applies what it answers for and stops at the first span it
            # does not; this loop applies that one (or, after a span the native loop could
            # not start with, a few more, doubling: a request of foreign spans stays cheap).
            rejected, i, take, runs, scope = decoded.rejected, 0, 1, reg.runs, principal.tenant
            apply = native.apply
            while True:
                j = apply(obs, i, touched, spent, runs, scope)
                if j >= n:
                    break
                take = 1 if j > i else min(2 * take, 64)
                i = min(j + take, n)
                rejected = self._apply(obs, j, i, touched, spent, principal, rejected, errors)
        (_flush if native is None else native.flush)(touched, spent)
        stats["rejected_spans"] += rejected - decoded.rejected
        self.conclude(touched, spent)
        return rejected, errors

    def _apply(
        self,
        observations: list[Observation],
        lo: int,
        hi: int,
        touched: dict[RunState, Touched],
        spent: dict[str, Usage],
        principal: Principal,
        rejected: int,
        errors: list[str],
    ) -> int:
        """The loop: apply ``observations[lo:hi]``; returns ``rejected`` plus the spans it
        refused (their first error texts are added to ``errors``)."""
        reg = self.registry
        stats = reg.stats
        runs_get = reg.runs.get
        trace_get = reg.by_trace.get
        scope = principal.tenant
        cost_of = reg.config.prices.cost_usd
        last_id: str | None = None  # consecutive spans mostly belong to the same run
        run: Any = None
        # The run whose tenant check passed last, with its tenant's usage and its touched
        # entry: consecutive spans of one run skip those lookups.
        cur: Any = None
        usage: Any = None
        entry: Touched | None = None
        for o in observations if lo == 0 and hi == len(observations) else observations[lo:hi]:
            run_id = o[RUN_ID]
            if run_id and run_id == last_id:
                pass
            elif run_id:
                run = runs_get(run_id)
                last_id = None
                if run is None:
                    if run_id in reg.ended:
                        stats["late_spans"] += 1
                        reg.budgets.late_span(o, scope, spent)  # still the tenant's spend
                        continue
                    if o[KIND] == KIND_RUN:
                        continue  # the end of a run we never tracked: nothing to decide
                    _flush(touched, spent)  # making room may end a run touched by this request
                    run = self._implicit(o, principal)
                    if run is None:
                        rejected += 1
                        if len(errors) < 5:
                            errors.append(f"run {run_id[:64]!r}: not admitted (capacity/tenant)")
                        continue
                last_id = run_id
            else:
                last_id = None
                run = trace_get(o[TRACE_ID])
                if run is None:
                    continue  # a GenAI span outside any guarded run: not ours to count
            if run is not cur:
                if scope is not None and run.tenant != scope:
                    # Another tenant's run (by guard.run.id, or owning the trace of a foreign
                    # span): never charged, and answered like a run nobody has (_foreign_refused)
                    if run_id and self._foreign_refused(o, principal):
                        rejected += 1
                        if len(errors) < 5:
                            errors.append(f"run {run_id[:64]!r}: not admitted (capacity/tenant)")
                    last_id = None
                    continue
                cur = run
                usage = spent.get(run.tenant)
                if usage is None:
                    usage = spent[run.tenant] = Usage()
                entry = touched.get(run)
            kind = o[KIND]
            if run.seq_gate is not None and kind != KIND_RUN and reg.gate(run, o):
                continue
            # The three common kinds are inlined (this loop runs once per span). Tool calls
            # are *counted* in the run's budget once per run per request (see _flush): they
            # only add up, nothing reads the run's tool counters before the decision, and
            # the loop detector still sees every call, in order.
            if kind == KIND_TOOL:
                attempts = o[ATTEMPTS] or 1  # an int >= 0 (decode checked it): cannot fail
                run.step_tools += 1
                if o[TOOL_NAME]:
                    run.last_tool = o[TOOL_NAME]
                fp = o[ACTION_FP]
                if fp:
                    run.last_action_hash = fp
                    try:
                        verdict = run.detector.observe_action(fp, o[RESULT_HASH])
                    except InvalidInput as exc:  # refused, as before: the call still counts
                        run.budget.record_tool_calls(1, attempts=attempts)
                        usage.tool_calls += 1
                        usage.tool_attempts += attempts
                        rejected += 1
                        if len(errors) < 5:
                            errors.append(str(exc))
                        continue
                else:
                    verdict = None
                if entry is None:
                    entry = touched[run] = Touched(_AFTER_TOOLS, verdict, 1, attempts)
                    continue
                entry.phase = _AFTER_TOOLS
                entry.tools += 1
                entry.attempts += attempts
            elif kind == KIND_STEP:
                budget = run.budget
                try:
                    budget.record_step()
                    usage.steps += 1
                    verdict = run.detector.end_step(
                        state=o[STATE_HASH], progress=o[PROGRESS], acted=run.step_tools > 0
                    )
                    index = o[STEP_INDEX] or budget.usage().steps
                    run.forecaster.observe(index, run.step_input_tokens)
                except InvalidInput as exc:  # from the policy: the span is refused
                    rejected += 1
                    if len(errors) < 5:
                        errors.append(str(exc))
                    continue
                run.step_input_tokens = 0
                run.last_step_tokens, run.step_tokens = run.step_tokens, 0
                run.last_step_cost, run.step_cost = run.step_cost, 0.0
                run.step_tools = 0
                run.last_step = index
                if entry is None:
                    entry = touched[run] = Touched(_BEFORE_STEP, verdict, 0, 0)
                    continue
                entry.phase = _BEFORE_STEP
            elif kind == KIND_MODEL:
                if (o[FOREIGN] or o[RESP_ID] or run.seen is not None) and self._duplicate(run, o):
                    continue
                inp, out, cached, reasoning = o[IN], o[OUT], o[CACHED], o[REASONING]
                model = o[MODEL]
                cost = o[COST]
                try:
                    if cost is None and model:
                        cost = cost_of(
                            model, input_tokens=inp, output_tokens=out, cached_tokens=cached
                        )
                    run.budget.record_model_call(
                        input_tokens=inp,
                        output_tokens=out,
                        reasoning_tokens=reasoning,
                        cached_tokens=cached,
                        cost_usd=cost,
                    )
                except InvalidInput as exc:  # from the budget: the span is refused
                    rejected += 1
                    if len(errors) < 5:
                        errors.append(str(exc))
                    continue
                total = inp + out
                run.step_input_tokens += inp
                run.step_tokens += total
                run.gate_tokens += total
                if cost is not None:
                    run.step_cost += cost
                    run.gate_cost_usd += cost
                    usage.cost_usd = (usage.cost_usd or 0.0) + cost
                if model:
                    run.model = model
                usage.model_calls += 1
                usage.input_tokens += inp
                usage.output_tokens += out
                usage.reasoning_tokens += reasoning
                usage.cached_tokens += cached
                if entry is None:
                    entry = touched[run] = Touched(_AFTER_MODEL, None, 0, 0)
                else:
                    entry.phase = _AFTER_MODEL
                continue
            else:
                _flush(touched, spent)  # the run may end here: its budget must be complete
                self._run_span(run, o)
                last_id = cur = None  # the run may have ended: look it up again
                continue
            if verdict is not None and (
                entry.verdict is None or verdict.level.rank > entry.verdict.level.rank
            ):
                entry.verdict = verdict
        return rejected

    def conclude(self, touched: dict[RunState, Touched], spent: dict[str, Usage]) -> None:
        """The end of a request: add each tenant's summed usage to its windows once, then
        decide each touched run once, with the phase of its last span and the strongest loop
        verdict it produced (and its parents, whose budgets its spend reached)."""
        reg = self.registry
        for tenant, usage in spent.items():
            td = reg.budgets.record(tenant, usage)
            if td.stop:
                reg.tenant_cut(tenant, td)
        if touched:
            reg.budgets.observe(touched)  # spend moves from the runs' grants to windows
            now = reg.clock()
            # all of them get touched_at = now below (also in the native loop): their span-only
            # ones move to the recent end of their tenants' LRUs (what make_room forgets first)
            reg.touch(touched)
            native = applier() if self.native else None
            if native is not None:  # the same, skipping the runs for which _decide does nothing
                native.conclude(touched, now, self._decide)
                return
            for run, entry in touched.items():
                run.touched_at = now
                self._decide(run, entry)

    def _decide(self, run: RunState, entry: Touched) -> None:
        """Decide one run the request touched, with the phase of its last span and the
        strongest loop verdict it produced, then its parents."""
        phase, verdict = entry.phase, entry.verdict
        reg = self.registry
        # escalation() returns None only when decide() could not return anything stronger
        # than the soft level the run already has; act() would then do nothing (SoftLevel
        # pushes each level once), so skipping it changes nothing.
        if run.stop_reason is None:
            d = run.budget.escalation(phase=phase, loop=verdict, above=run.soft.level)
            if d is not None:
                reg.act(run, d, verdict)
            if (
                phase is _BEFORE_STEP
                and run.stop_reason is None
                and not run.forecast_warned
                and _forecast_due(run, run.budget.limits)  # forecast()'s cheap gate
            ):
                reg.forecast(run, run.last_step)
        if run.parent is not None:
            self._decide_parents(run, phase)
