"""The span path's rarer cases (a part of :class:`~guard.server.applier._applier.SpanApplier`): spans
of runs nobody registered (implicit runs), of other tenants' runs, repeated model calls, the
run span, and the decisions a nested run's spend reaches in its parents."""

from __future__ import annotations

from typing import TYPE_CHECKING

from guard.policy import DecidedBy, Phase, Reason, Status
from guard.server.decode._schema import (
    AGENT,
    FOREIGN,
    IN,
    KIND,
    KIND_RUN,
    OUT,
    PARENT_RUN,
    PARENT_SPAN_ID,
    RESP_ID,
    RUN_ID,
    SEQ,
    SPAN_ID,
    STOP_REASON,
    STOP_STATUS,
    TENANT,
    TRACE_ID,
)

if TYPE_CHECKING:  # pragma: no cover
    from guard.server.applier._host import SpanHost
    from guard.server.decode._schema import Observation
    from guard.server.runs._state import RunState
    from guard.server.runtime._auth import Principal

__all__ = ["SpanEdges"]


class SpanEdges:
    """Mixin of the span applier (its host is ``self.registry``)."""

    registry: SpanHost

    def _foreign_refused(self, o: Observation, principal: Principal) -> bool:
        """For a span naming another tenant's run: would a run nobody has be refused here?

        Such a span is dropped either way (one id cannot name two runs, so no implicit run is
        made); this only makes the answer the same as for an unknown id (``_implicit``), so
        that the answer says nothing of other tenants' run ids: a run span is not refused
        (an unknown one is skipped), a span claiming a tenant other than the caller's is,
        and so is any other when the caller's tenant has no room (its rate of new runs is
        spent, or the cap is reached and no span-only run could make room).
        """
        if o[KIND] == KIND_RUN:
            return False
        tenant = o[TENANT] or (principal.tenant or "")
        if principal.tenant is not None and tenant != principal.tenant:
            return True
        return not self.registry.has_room(tenant)

    def _implicit(self, o: Observation, principal: Principal) -> RunState | None:
        """A span of a run that never said RunStarted: track it from its spans alone.

        The tenant is checked first, then its rate of new runs from spans
        (``guard.max_new_span_runs_per_s``); at the cap, room is made as ``make_room`` says
        (never from a tenant within its share of the table)."""
        reg = self.registry
        tenant = o[TENANT] or (principal.tenant or "")
        if principal.tenant is not None and tenant != principal.tenant:
            return None
        if not reg.take_span_run(tenant):
            reg.stats["span_runs_rate_limited"] += 1
            return None
        if len(reg.runs) >= reg.max_runs and not reg.make_room(tenant):
            reg.stats["capacity_rejections"] += 1
            return None
        trace = o[TRACE_ID]
        run = reg.new_run(
            o[RUN_ID],
            tenant=tenant,
            agent=o[AGENT] or "",
            parent_run_id=o[PARENT_RUN] or "",  # another tenant's run is no parent (new_run)
            trace=trace if len(trace) == 16 else b"",  # OTLP trace ids are 16 bytes
            started_at=0.0,
            limits=reg.config.effective_limits(None),
            session=None,
            admitted=False,
        )
        if o[SEQ] is not None:  # numbered: its agent has a control stream and will register it
            run.seq_gate = []
        return run

    def _duplicate(self, run: RunState, o: Observation) -> bool:
        """True when this model span is a call already counted (see ``SeenCalls``); else
        remembers it. Only for foreign spans, spans with a response id, or runs that have
        seen either (the others cannot repeat a counted call)."""
        reg = self.registry
        foreign = o[FOREIGN]
        resp = o[RESP_ID]
        parent = o[PARENT_SPAN_ID]
        counts = (o[IN], o[OUT])
        seen = run.seen_calls()
        if seen.duplicate(o[SPAN_ID], parent, resp, counts, foreign):
            reg.stats["duplicate_model_calls"] += 1
            return True
        seen.add(o[SPAN_ID], parent if foreign else b"", resp)
        seen.sibling(parent, counts, foreign, resp or "")
        if foreign:
            reg.stats["foreign_model_calls"] += 1
        return False

    def _decide_parents(self, run: RunState, phase: Phase) -> None:
        reg = self.registry
        parent = run.parent
        while parent is not None:  # nested runs spend their parents' budgets too
            if parent.stop_reason is None and parent.run_id in reg.runs:
                d = parent.budget.escalation(phase=phase, above=parent.soft.level)
                if d is not None:
                    reg.act(parent, d)
            parent = parent.parent

    def _run_span(self, run: RunState, o: Observation) -> None:
        reg = self.registry
        if run.connected:
            return  # RunEnded over the stream is the record
        try:
            status = Status(o[STOP_STATUS]) if o[STOP_STATUS] else Status.COMPLETED
            reason = Reason(o[STOP_REASON]) if o[STOP_REASON] else Reason.FINAL_ANSWER
        except ValueError:
            status, reason = Status.FAILED, Reason.ERROR
        if run.session is not None or run.provisional:
            # Its agent has (or had) a control stream: its RunEnded, resent until acked, is
            # the record. Written from these stop attributes only if the agent does not come
            # back within agent_grace_s (Lifecycle.sweep); the identity is kept for that.
            run.end_hint = (status, reason)
            if not run.agent and o[AGENT]:
                run.agent = o[AGENT]
            if not run.tenant and o[TENANT]:
                reg.set_tenant(run, o[TENANT])
            return
        if run.stop_by is not None and reason in (Reason.OPERATOR_CANCEL, run.stop_reason):
            by = run.stop_by
        else:
            by = DecidedBy.SDK
        reg.end_run(run, status, reason, "from the run span (no control stream)", by)
