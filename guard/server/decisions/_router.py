"""Turning policy decisions into commands: warn, wrap_up and cancel, per run and per tenant.

A part of :class:`guard.server.runs._registry.Registry` (``registry.decisions``). The policy
engine decides; this module only routes: soft levels go through ``SoftLevel`` (each pushed
once), a stop becomes one cancel (a run is cancelled at most once per reason-holder), and
every command yields a ``DecisionRecord`` written when the agent acks it.

Forecast warning (a rule of the guard, not of the policy engine): after each step the guard fits the
run's input tokens per step (B + (n-1)·D); when the fit says the token or cost budget runs
out within :data:`FORECAST_HORIZON_STEPS` steps of the current one, the run gets one ``warn``
with reason token_budget / cost_budget and the forecast numbers, early enough to summarise.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from guard.errors import InvalidInput
from guard.policy import METRIC_REASON, Action, DecidedBy, Decision, Phase, Reason, Status
from guard.records import DecisionRecord
from guard.server.runs._scope import RunPart, Scope
from guard.server.runtime._auth import Principal
from guard.server.runtime._status import PermissionDenied, UnknownRun

if TYPE_CHECKING:  # pragma: no cover
    from guard.server.bus._interface import DirectiveBus
    from guard.server.control._fanout import AgentSession, DecisionLog
    from guard.server.runs._state import RunState
    from guard.v1 import guard_pb2 as pb

__all__ = [
    "FORECAST_HORIZON_STEPS",
    "SELECTOR_DENY_S",
    "DecisionRouter",
    "EndRun",
    "decision_record",
]

FORECAST_HORIZON_STEPS = 2
# A fleet cancel by selector denies matching runs that start on this replica for this long
# (it is being carried out across the replicas meanwhile; the caller waits at most ~1 s).
SELECTOR_DENY_S = 3.0
_TENANT_RESCAN_S = 0.5  # after a tenant cut, re-check its runs at most this often


def _reason_of(d: Decision) -> str:
    if d.reason is not None:
        return str(d.reason.value)
    r = METRIC_REASON.get(d.metric or "")
    return r.value if r is not None else ""


def _forecast_due(run: RunState, limits: Any) -> bool:
    """Cheap gate before the (costlier) forecast: is the budget left within a few steps?

    Two more steps cost at most about 2·(last step) + 3·D; with D below a step's cost, four
    last steps bound that generously. Far from the limit the fit cannot say "within two
    steps", so it is skipped.
    """
    span = FORECAST_HORIZON_STEPS + 2
    tokens = limits.max_tokens
    if tokens is not None and tokens - run.gate_tokens <= span * max(run.last_step_tokens, 1):
        return True
    cost = limits.max_cost_usd
    step_cost = run.last_step_cost
    return cost is not None and step_cost > 0 and cost - run.gate_cost_usd <= span * step_cost


def decision_record(
    run_id: str,
    tenant: str,
    agent: str,
    action: str,
    reason: str,
    detail: str,
    util: float | None,
    metric: str | None,
    by: str,
) -> DecisionRecord:
    """The one place a :class:`DecisionRecord` is made (warn, wrap_up, cancel, deny), stamped
    with the decision time; the command id, latency and guard id are added on delivery."""
    return DecisionRecord(
        decided_at=time.time(),
        run_id=run_id,
        tenant=tenant,
        agent=agent,
        action=action,
        reason=reason,
        detail=detail,
        utilisation=util,
        metric=metric,
        decided_by=by,
    )


class EndRun(Protocol):
    """Ends a run on the guard's side and writes its record (``Lifecycle.end_run``)."""

    def __call__(
        self, run: RunState, status: Status, reason: Reason, message: str, decided_by: DecidedBy
    ) -> Any: ...


class DecisionRouter(RunPart):
    """Builds and routes the decisions of the runs in ``table``: soft levels, stops, tenant
    cuts, operator and fleet cancels. Delivers through ``bus`` (the record is written on the
    agent's ack) or writes the record to ``log`` at once; a stop nobody can be told of is
    ended through ``end_run``."""

    def __init__(self, scope: Scope, bus: DirectiveBus, log: DecisionLog, *, end_run: EndRun):
        super().__init__(scope)
        self.by_tenant = scope.table.by_tenant
        self.bus = bus
        self.log = log
        self.end_run = end_run
        self._tenant_cut: dict[str, float] = {}
        # fleet cancels by selector being carried out (see deny_starts)
        self._denials: dict[tuple[str, str, str | None], tuple[float, str]] = {}

    def issue(self, run: RunState, action: str, reason: str, detail: str, util, metric) -> None:
        """Push warn / wrap_up to the run's agent (recorded; dropped if unreachable)."""
        record = decision_record(
            run.run_id, run.tenant, run.agent, action, reason, detail, util, metric, "guard"
        )
        self._route(run, record)

    def _route(self, run: RunState, record: DecisionRecord) -> bool:
        """Deliver a decision to the run's agent through the directive bus (the record is
        written on its ack), or write the record at once when nobody holds the run's stream.
        True when it was sent."""
        if self.bus.deliver(run, record):
            return True
        self.log.write(record, None)
        return False

    def stop_run(
        self,
        run: RunState,
        reason: Reason,
        detail: str,
        util: float | None,
        metric: str | None,
        by: DecidedBy,
        record: DecisionRecord | None = None,
    ) -> None:
        """Cancel a run once. The agent answers with RunEnded (decided_by from the cancel).
        ``record``: the decision's record when another replica reached it (see
        :meth:`remote_decision`)."""
        if run.stop_reason is not None:
            return
        run.stop_reason = reason
        run.stop_detail = detail
        run.stop_by = by
        if record is None:
            record = decision_record(
                run.run_id,
                run.tenant,
                run.agent,
                "cancel",
                reason.value,
                detail,
                util,
                metric,
                by.value,
            )
        if self._route(run, record):
            return
        # Nobody to tell: the operator's word ends it now. A provisional run's agent is about
        # to re-register: the cancel reaches it then (Registry._adopt), or the sweep ends it.
        if by is DecidedBy.OPERATOR and not run.provisional:
            self.end_run(run, Status.CANCELLED, Reason.OPERATOR_CANCEL, detail, by)

    def resend_stop(self, run: RunState) -> None:
        """Send the cancel of a stopping run again, through the bus: its stream moved to
        another replica, and the cancel sent to the old holder may have died with it (the
        new holder drops it if its run is already stopping)."""
        if run.stop_reason is not None:
            by = run.stop_by.value if run.stop_by is not None else DecidedBy.GUARD.value
            reason, detail = run.stop_reason.value, run.stop_detail
            record = decision_record(
                run.run_id, run.tenant, run.agent, "cancel", reason, detail, None, None, by
            )
            self.bus.deliver(run, record)

    def deny(
        self,
        session: AgentSession,
        rs: pb.RunStarted,
        tenant: str,
        reason: str,
        detail: str,
        util: float | None = None,
        metric: str | None = None,
    ) -> None:
        """Answer a registration with Deny (its record is written on the agent's ack)."""
        self.stats["denied"] += 1
        record = decision_record(
            rs.run_id, tenant, rs.agent, "deny", reason, detail, util, metric, "guard"
        )
        session.push(record, request_id=rs.request_id)

    def act(self, run: RunState, d: Decision, verdict: Any = None) -> None:
        """Route one decision of ``run``'s budget."""
        if run.stop_reason is not None:
            return
        action = d.action
        if action is Action.STOP:
            self.stop_run(
                run, d.reason or Reason.ERROR, d.message, d.utilisation, d.metric, DecidedBy.GUARD
            )
            return
        if action is not Action.CONTINUE:
            soft = run.soft.advance(d)
            if soft is not None:
                self.issue(run, soft.value, _reason_of(d), d.message, d.utilisation, d.metric)
        elif verdict is not None and verdict.level is Action.WARN and not run.loop_warned:
            # the decision order did not surface the loop warning: push it ourselves, once
            run.loop_warned = True
            reason = verdict.reason.value if verdict.reason is not None else "loop_detected"
            self.issue(run, "warn", reason, verdict.detail, d.utilisation, d.metric)

    def check_deadline(self, run: RunState) -> None:
        """Heartbeat path: only the clock moved, so only time-based limits can fire.

        The same as ``act(run, budget.decide(AFTER_TOOL_BATCH))``, without the full decide()
        when nothing fires: act() does something only for a decision that outranks the
        run's soft level (a STOP always does; SoftLevel pushes each level once), and
        ``escalation(above=level)`` returns exactly decide()'s decision in that case and None
        otherwise (tests/server/test_heartbeat_deadline.py holds it to the old path)."""
        if run.stop_reason is None and run.budget.limits.deadline_s is not None:
            d = run.budget.escalation(phase=Phase.AFTER_TOOL_BATCH, above=run.soft.level)
            if d is not None:
                self.act(run, d)

    def forecast(self, run: RunState, step_index: int) -> None:
        limits = run.budget.limits
        if run.forecast_warned or not _forecast_due(run, limits):
            return
        price = self.config.prices.models.get(run.model) if run.model else None
        per_token = price.input / 1e6 if price is not None else None
        fc = run.forecaster.forecast(limits, run.budget.usage(), usd_per_input_token=per_token)
        if fc.exhaust_step is None or fc.exhaust_step > step_index + FORECAST_HORIZON_STEPS:
            return
        run.forecast_warned = True
        reason = METRIC_REASON.get(fc.metric or "tokens", Reason.TOKEN_BUDGET)
        detail = (
            f"forecast: {fc.metric or 'tokens'} budget runs out at step {fc.exhaust_step} "
            f"(now step {step_index}; input tokens/step ≈ {fc.base_tokens:.0f} + "
            f"(n-1)·{fc.delta_tokens:.0f})"
        )
        util, metric = run.budget.utilisation()
        self.issue(run, "warn", reason.value, detail, util, fc.metric or metric)

    def tenant_cut(self, tenant: str, d: Decision) -> None:
        """A tenant window is exhausted: cancel every live run of the tenant, everywhere."""
        now = self.clock()  # the registry's monotonic clock
        last = self._tenant_cut.get(tenant)
        if last is not None and now - last < _TENANT_RESCAN_S:
            return
        self._tenant_cut[tenant] = now
        for run_id in list(self.by_tenant.get(tenant, ())):
            run = self.runs.get(run_id)
            if run is not None and run.stop_reason is None:
                self.stop_run(
                    run, Reason.TENANT_BUDGET, d.message, d.utilisation, d.metric, DecidedBy.GUARD
                )

    # -- operator cancel -------------------------------------------------------------------
    def cancel(self, target: str, value: Any, detail: str, principal: Principal) -> list[str]:
        """GuardAdmin.Cancel of the runs whose streams this replica holds (a run whose stream
        another replica holds is that one's to cancel). ``target`` is the Selector oneof
        name."""
        detail = detail or "cancelled by operator"
        if target == "run_id":
            runs = [self.table.live(value, principal)]  # another tenant's: NOT_FOUND, as unknown
            if runs[0].remote is not None:
                raise UnknownRun(f"run {value[:64]!r} is not live on this guard")
        elif target == "tenant":
            principal.check_tenant(value, "runs")
            runs = [self.runs[i] for i in self.by_tenant.get(value, ()) if i in self.runs]
        elif target == "agent":
            runs = [
                r
                for r in self.runs.values()
                if r.agent == value and (principal.tenant is None or r.tenant == principal.tenant)
            ]
        elif target == "all":
            if not principal.admin:
                raise PermissionDenied("cancel --all needs the admin token")
            runs = list(self.runs.values())
        else:
            raise InvalidInput("selector is empty: give run_id, tenant, agent or all")
        ids = []
        for run in runs:
            if run.remote is not None:
                continue
            ids.append(run.run_id)
            if run.stop_by is not DecidedBy.OPERATOR:
                run.stop_reason = None  # an operator cancel overrides a pending guard cancel
                self.stop_run(run, Reason.OPERATOR_CANCEL, detail, None, None, DecidedBy.OPERATOR)
        return ids

    # -- several replicas ----------------------------------------------------------------------
    def remote_decision(self, record: DecisionRecord) -> None:
        """A decision another replica reached for a run whose stream this one holds (the
        directive bus): pushed like one of ours, and its record written here on the ack. A
        cancel of a run already stopping is moot (its agent has one): dropped, counted."""
        run = self.runs.get(record.run_id)
        if run is None or run.remote is not None:
            self.stats["directives_unheld"] = self.stats.get("directives_unheld", 0) + 1
            self.log.write(record, None)  # ended or moved meanwhile: the decision is recorded
            return
        if record.action != "cancel":
            self._route(run, record)
            return
        if run.stop_reason is not None:
            self.stats["directives_moot"] = self.stats.get("directives_moot", 0) + 1
            return
        try:
            reason = Reason(record.reason)
            by = DecidedBy(record.decided_by)
        except ValueError:
            reason, by = Reason.ERROR, DecidedBy.GUARD
        self.stop_run(run, reason, record.detail, None, None, by, record)

    def deny_starts(self, target: str, value: Any, principal: Principal, detail: str) -> None:
        """While a fleet cancel by selector is carried out, runs matching it that start here
        are denied (see :meth:`cancelling`)."""
        now = self.clock()
        for key, (until, _) in list(self._denials.items()):
            if until <= now:
                del self._denials[key]
        if len(self._denials) < 1024:  # bounded: each is one operator's cancel
            key = (target, str(value), principal.tenant)
            self._denials[key] = (now + SELECTOR_DENY_S, detail or "cancelled by operator")

    def cancelling(self, tenant: str, agent: str) -> str | None:
        """The detail of a fleet cancel being carried out that matches a run starting now."""
        if not self._denials:
            return None
        now = self.clock()
        for (target, value, scope), (until, detail) in self._denials.items():
            if until <= now or (scope is not None and scope != tenant):
                continue
            if (
                target == "all"
                or (target == "tenant" and value == tenant)
                or (target == "agent" and value == agent)
            ):
                return detail
        return None
