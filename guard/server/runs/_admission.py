"""Runs and sessions coming in: RunStarted, Hello (with its live runs), heartbeats, acks and
a dropped stream.

A part of :class:`guard.server.runs._registry.Registry` (``registry.admission``). A registration
asks the tenant's budgets for a verdict (``TenantBudgets.admit``; shared budgets may answer
later) and then makes the run and sends Admit, or Deny. A re-registered run is rebuilt by
:class:`~guard.server.runs._rejoin.Rejoin`; a fleet cancel being carried out
(``DecisionRouter.cancelling``) denies or stops matching runs.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from guard.errors import InvalidInput
from guard.policy import (
    Budget,
    DecidedBy,
    Decision,
    Forecaster,
    Limits,
    LoopDetector,
    Reason,
    SoftLevel,
)
from guard.server.control._fanout import AgentSession
from guard.server.decisions._router import DecisionRouter
from guard.server.runs._rejoin import Rejoin
from guard.server.runs._scope import RunPart, Scope
from guard.server.runs._state import RunState, SeqGate
from guard.server.runtime._auth import Principal
from guard.server.runtime._ordered import OrderedSet
from guard.server.tenants._allowances import spend_of
from guard.v1 import guard_pb2 as pb
from guard.wire import admit_to_pb, limits_from_pb, usage_from_pb

__all__ = ["Admission"]

_MAX_ID = 256


def _trace_bytes(hex_id: str) -> bytes:
    if not hex_id:
        return b""
    try:
        raw = bytes.fromhex(hex_id)
    except ValueError:
        raise InvalidInput(f"trace_id {hex_id[:40]!r} is not hex") from None
    if len(raw) != 16:
        raise InvalidInput(f"trace_id must be 32 hex characters (got {len(hex_id)})")
    return raw


@dataclass(slots=True)
class _Registration:
    """A RunStarted (or a Hello.live_runs entry) on its way to its tenant's verdict."""

    session: AgentSession
    rs: pb.RunStarted
    principal: Principal
    tenant: str
    restoring: bool
    trace: bytes = b""
    requested: Limits | None = None
    restored: Any = None  # the re-registered run's usage snapshot
    pending: bool = False  # inside budgets.admit: a verdict now comes with nothing changed


class Admission(RunPart):
    """Admits the runs of ``table`` and keeps the agent ``sessions``. Rebuilds re-registered
    runs through ``rejoin``, stops runs through ``decisions`` and untracks the run a
    registration replaces through ``forget`` (``Lifecycle.forget``)."""

    def __init__(
        self,
        scope: Scope,
        *,
        decisions: DecisionRouter,
        rejoin: Rejoin,
        forget: Callable[[RunState], None],
        sessions: OrderedSet[AgentSession],
    ) -> None:
        super().__init__(scope)
        self.decisions = decisions
        self.rejoin = rejoin
        self._forget = forget
        self.sessions = sessions

    def _check_id(self, run_id: str) -> None:
        if not run_id:
            raise InvalidInput("run_id is empty")
        if len(run_id) > _MAX_ID:
            raise InvalidInput(f"run_id has {len(run_id)} chars (max {_MAX_ID})")

    def register(
        self,
        session: AgentSession,
        rs: pb.RunStarted,
        principal: Principal,
        *,
        restoring: bool = False,
    ) -> None:
        """Handle RunStarted (or one Hello.live_runs entry): answer Admit or Deny.

        The tenant's verdict may come later (shared budgets settle a slot with the fleet in
        ``budgets.sync``): :meth:`_admitted` then takes it from there, and checks again what
        may have changed meanwhile (the same run registered on another stream, its spans
        made it provisional, it ended)."""
        run_id = rs.run_id
        if not run_id or len(run_id) > _MAX_ID:
            self._check_id(run_id)  # raises the words for it
        tenant = rs.tenant or session.tenant or (principal.tenant or "")
        principal.check_tenant(tenant)
        if len(tenant) > _MAX_ID or len(rs.agent) > _MAX_ID:
            raise InvalidInput("tenant/agent longer than 256 chars")
        reg = _Registration(session, rs, principal, tenant, restoring)
        if self._answered(reg):
            return
        reg.trace = _trace_bytes(rs.trace_id)
        reg.requested = limits_from_pb(rs.requested) if rs.HasField("requested") else None
        reg.restored = usage_from_pb(rs.usage) if restoring and rs.HasField("usage") else None
        if self.table.full() and not self.make_room(tenant):
            self.stats["capacity_rejections"] += 1
            self.decisions.deny(
                session,
                rs,
                tenant,
                Reason.ERROR.value,
                f"guard at capacity: {len(self.runs)} tracked runs (max_tracked_runs="
                f"{self.table.max_runs})",
            )
            return
        if (
            not restoring
            and (cancelling := self.decisions.cancelling(tenant, rs.agent)) is not None
        ):
            # a fleet cancel by selector is being carried out: a matching new run is denied
            self.decisions.deny(session, rs, tenant, Reason.OPERATOR_CANCEL.value, cancelling)
            return
        parent = self.runs.get(rs.parent_run_id) if rs.parent_run_id else None
        root = parent is None or parent.tenant != tenant
        seen = (spend_of(reg.restored) or (0.0, 0.0)) if root else None
        # A verdict given at once (the in-memory budgets) finds everything as _answered just
        # did: _admitted need not look again (``reg.pending`` tells it so).
        reg.pending = True
        self.budgets.admit(tenant, run_id, functools.partial(self._admitted, reg), grant=seen)
        reg.pending = False

    def _answered(self, reg: _Registration) -> bool:
        """Answer a registration that needs no verdict of the tenant's budget (another
        tenant's id, a live run re-attaching, an ended run); False to go on."""
        session, rs, tenant = reg.session, reg.rs, reg.tenant
        run = self.runs.get(rs.run_id)
        principal = reg.principal
        if run is not None and principal.tenant is not None and run.tenant != principal.tenant:
            # Another tenant's live run: never attach it, and never say whose it is. (An id
            # nobody has would be admitted; one id cannot name two runs, so this one is
            # refused like a reused id, in words that do not depend on the other tenant.)
            self.decisions.deny(session, rs, tenant, Reason.ERROR.value, "run_id is already in use")
            return True
        if run is not None and not run.provisional:
            self._attach(run, session)
            self._admit_msg(session, run, rs.request_id)
            return True
        if rs.run_id in self.ended:
            if reg.restoring:  # ended while its agent was away (agent_lost): tell it so
                session.cancel(
                    rs.run_id,
                    Reason.AGENT_LOST.value,
                    "run was ended by the guard while its agent was disconnected",
                )
            else:
                self.decisions.deny(session, rs, tenant, Reason.ERROR.value, "run_id already ended")
            return True
        return False

    def _admitted(self, reg: _Registration, verdict: Decision) -> None:
        """The tenant's verdict on a registration: deny, or make the run and Admit it."""
        session, rs, tenant, restoring = reg.session, reg.rs, reg.tenant, reg.restoring
        stop = verdict.stop
        if not stop and (session.closed or (not reg.pending and self._answered(reg))):
            # Not this registration's slot after all. A run of that id that is live now (a
            # repeated RunStarted) holds the fleet's slot and grant: only the local count.
            self.budgets.run_ended(tenant, "" if rs.run_id in self.runs else rs.run_id)
            return
        # A Hello entry still waiting for its first answer (request_id set) was never
        # admitted: denied like a new run, not admitted-then-cancelled (its agent would start
        # it, with no ceilings, until the cancel lands).
        if stop and (not restoring or rs.request_id):
            why = (verdict.reason or Reason.TENANT_BUDGET).value  # error: budgets unavailable
            self.decisions.deny(
                session, rs, tenant, why, verdict.message, verdict.utilisation, verdict.metric
            )
            return
        waiting: RunState | None = None
        kept: Any = None
        run = self.runs.get(rs.run_id)
        if run is not None:
            # Spans got here first: the agent's identity, limits and counters replace the
            # guard's guess; the spans it kept are counted below, above the snapshot's floor.
            waiting, kept = run, run.seq_gate
            self._forget(run)  # releases what it held (kept here)
        requested, config = reg.requested, self.config
        # effective_limits(None) is the run defaults themselves
        effective = config.runs if requested is None else config.effective_limits(requested)
        run = self.new_run(
            rs.run_id,
            tenant=tenant,
            agent=rs.agent,
            parent_run_id=rs.parent_run_id,
            trace=reg.trace,
            started_at=rs.started_at_unix or time.time(),
            limits=effective,
            session=session,
            admitted=not stop,
            restoring=restoring,
        )
        if reg.restored is not None:
            self.rejoin.restore_usage(run, reg.restored)
        if (restoring and rs.span_seq) or waiting is not None:
            # spans numbered <= span_seq are in the restored usage; each later one counts once
            run.seq_gate = SeqGate(rs.span_seq if restoring else 0)
        self._admit_msg(session, run, rs.request_id)
        if waiting is not None:
            self.rejoin.adopt(run, waiting, kept, reg.principal)
        # A fleet cancel that matches it: a re-registered run stops now; a new run admitted
        # while the fleet's verdict was on its way (the cancel began meanwhile) too.
        cancelling = self.decisions.cancelling(tenant, rs.agent)
        if cancelling is not None:
            self.decisions.stop_run(
                run, Reason.OPERATOR_CANCEL, cancelling, None, None, DecidedBy.OPERATOR
            )
        elif stop:  # re-registered into an exhausted tenant: it must stop now
            self.decisions.stop_run(
                run,
                verdict.reason or Reason.TENANT_BUDGET,
                verdict.message,
                verdict.utilisation,
                verdict.metric,
                DecidedBy.GUARD,
            )

    def new_run(
        self,
        run_id: str,
        *,
        tenant: str,
        agent: str,
        parent_run_id: str,
        trace: bytes,
        started_at: float,
        limits: Limits,
        session: AgentSession | None,
        admitted: bool,
        restoring: bool = False,
    ) -> RunState:
        parent = self.runs.get(parent_run_id) if parent_run_id else None
        if parent is not None and parent.tenant != tenant:
            parent = None  # another tenant's run is no parent: exactly as if it were unknown
        # Re-registered after a reconnect: the deadline clock resumes from the agent's start
        # time (only then: for new runs, agent/guard clock skew must not eat the deadline).
        age = time.time() - started_at if restoring else 0.0
        clock = self.clock
        if age > 1.0:
            base = clock

            def clock(base: Callable[[], float] = base, age: float = age) -> float:
                return base() + age

        budget = Budget(limits, parent=parent.budget if parent else None, clock=clock)
        now = self.clock()
        run = RunState(
            run_id,
            tenant=tenant,
            agent=agent,
            parent_run_id=parent_run_id,
            trace_id=trace,
            started_at=started_at,
            budget=budget,
            detector=LoopDetector(limits.loop),
            forecaster=Forecaster(),
            soft=SoftLevel(),
            session=session,
            parent=parent,
            admitted=admitted,
            now=now,
        )
        self.table.add(run, span_only=session is None)
        if session is not None:
            self.directory.claim(run, session)
        return run

    def _admit_msg(self, session: AgentSession, run: RunState, request_id: int) -> None:
        self.budgets.on_admit(run, session)  # the run's ceilings arrive before its Admit
        version = self.config.prices.version or ""
        msg, body = session.compose("admit")
        admit_to_pb(run.run_id, request_id, run.budget.limits, version, into=body)
        session.post(msg)

    def _attach(self, run: RunState, session: AgentSession) -> None:
        run.remote = None  # guarded here as another replica's run until now: ours again
        self.directory.claim(run, session)
        run.detached_at = None
        run.touched_at = self.clock()
        self.table.attached(run)
        if run.stop_reason is not None:  # a cancel it may have missed while away
            session.cancel(run.run_id, run.stop_reason.value, run.stop_detail)

    def make_room(self, tenant: str) -> bool:
        """At the cap: forget the span-only run :meth:`RunTable.room_from` names for a new run
        of ``tenant`` (its own tenant's, or a tenant's over its share); False when none may
        go. A tenant within its share of the table never loses a run to another."""
        stalest = self.table.room_from(tenant)
        if stalest is None:
            return False
        self._forget(stalest)
        return True

    # -- sessions --------------------------------------------------------------------------
    def hello(
        self, session: AgentSession, hello: pb.Hello, principal: Principal, *, restore: bool = True
    ) -> None:
        """Open a session. ``restore=False``: the caller registers ``hello.live_runs`` itself
        (the control reader does, in slices that yield to the event loop)."""
        tenant = hello.tenant or (principal.tenant or "")
        principal.check_tenant(tenant, "the stream")
        session.tenant = tenant
        session.process_id = hello.process_id[:_MAX_ID]
        session.host = hello.host[:_MAX_ID]
        session.pid = hello.pid
        self.sessions.add(session)
        self.rejoin.ended_elsewhere(hello.ended_runs, tenant)
        for rs in hello.live_runs if restore else ():
            self.register(session, rs, principal, restoring=True)

    def detach(self, session: AgentSession) -> None:
        """The stream dropped: keep its runs for ``agent_grace_s``, then agent_lost."""
        session.close()
        self.sessions.discard(session)
        now = self.clock()
        for run_id in list(session.runs):
            run = self.runs.get(run_id)
            if run is not None and run.session is session:
                self.table.detach(run, now)
        session.runs.clear()

    def ack(self, session: AgentSession, ack: pb.Ack) -> None:
        session.ack(ack.command_id)

    def heartbeat(self, session: AgentSession, hb: pb.Heartbeat) -> None:
        now = self.clock()
        for rp in hb.runs:
            run = self.runs.get(rp.run_id)
            if run is None or run.session is not session:
                continue
            run.touched_at = now
            if rp.paused != run.paused:
                run.paused = rp.paused
                (run.budget.pause if rp.paused else run.budget.resume)()
            self.decisions.check_deadline(run)
