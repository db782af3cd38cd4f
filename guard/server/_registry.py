"""The run registry: every live run, who owns it, and how runs start and end.

Runs enter through ``GuardControl`` (RunStarted, or Hello.live_runs after a reconnect) or,
for agents without a control stream, implicitly from their first span. They leave through
RunEnded, the run span's end (span-only or detached runs), ``agent_lost`` after the grace
period, or an operator cancel of a run whose agent cannot be reached. Every way out writes
exactly one ``Outcome`` to the sink (``_ended`` de-duplicates by run id).

The registry lives on the server's event loop; nothing here blocks or awaits. The span path
is a part of its own (``_ingest.SpanApplier``, ``registry.applier``); the decision path
(``_decisions.Decisions``), the ways out (``_lifecycle.Lifecycle``) and re-registration
(``_rejoin.Rejoin``) are mixed in.
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
    PolicyConfig,
    Reason,
    SoftLevel,
)
from guard.server._allowances import spend_of
from guard.server._auth import Principal
from guard.server._decisions import Decisions, decision_record
from guard.server._decode import Decoded
from guard.server._fanout import AgentSession, DecisionLog
from guard.server._ingest import SpanApplier
from guard.server._lifecycle import Lifecycle
from guard.server._parts import (
    DirectiveBus,
    PartsFactory,
    RunDirectory,
    TenantBudgets,
    local_parts,
)
from guard.server._rejoin import Rejoin
from guard.server._state import RunState, SeqGate
from guard.server._status import UnknownRun
from guard.server._table import RunTable
from guard.v1 import guard_pb2 as pb
from guard.wire import admit_to_pb, limits_from_pb, usage_from_pb

__all__ = ["Registry"]

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


class Registry(Decisions, Lifecycle, Rejoin):
    """Per-run state for one guard process."""

    def __init__(
        self,
        config: PolicyConfig,
        sink: Any,
        *,
        guard_id: str,
        clock: Callable[[], float] = time.monotonic,
        parts: PartsFactory = local_parts,
    ) -> None:
        self.config = config
        self.sink = sink
        self.guard_id = guard_id
        self.clock = clock
        self.log = DecisionLog(sink, guard_id)
        self.table = RunTable(config.guard.max_tracked_runs)
        # read-only views of the table's maps (only RunTable changes them)
        t = self.table
        self.runs, self.by_trace, self.by_tenant = t.runs, t.by_trace, t.by_tenant
        self.detached, self.span_only, self.ended = t.detached, t.span_only, t.ended
        self.max_runs = t.max_runs
        self.sessions: set[AgentSession] = set()
        self.grace_s = float(config.guard.agent_grace_s)
        self.stats: dict[str, int] = {
            "spans": 0,
            "observations": 0,
            "rejected_spans": 0,
            "duplicate_model_calls": 0,
            "foreign_model_calls": 0,
            "late_spans": 0,
            "denied": 0,
            "agent_lost": 0,
            "capacity_rejections": 0,
            "replayed_spans": 0,
            "provisional_spans_dropped": 0,
            "adopted_runs": 0,
            "records_acked": 0,
        }
        self._tenant_cut: dict[str, float] = {}
        self._denials: dict[Any, tuple[float, str]] = {}  # fleet cancels (Decisions.cancelling)
        self.applier = SpanApplier(self)
        # tenant budgets, the run directory and the directive bus: in memory, or shared by
        # replicas (see _parts); nothing else here knows which
        self.parts = chosen = parts(self)
        self.budgets: TenantBudgets = chosen.budgets
        self.directory: RunDirectory = chosen.directory
        self.bus: DirectiveBus = chosen.bus

    @property
    def provisional_spans(self) -> int:
        """Spans held by provisional runs (see ``RunTable.hold``)."""
        return self.table.provisional_spans

    def ingest(self, decoded: Decoded, principal: Principal) -> tuple[int, list[str]]:
        """Apply one OTLP request's observations (see :class:`SpanApplier`). Returns (rejected
        spans, the first error texts)."""
        return self.applier.ingest(decoded, principal)

    # -- admission ------------------------------------------------------------------------
    def _check_id(self, run_id: str) -> None:
        if not run_id:
            raise InvalidInput("run_id is empty")
        if len(run_id) > _MAX_ID:
            raise InvalidInput(f"run_id has {len(run_id)} chars (max {_MAX_ID})")

    def _deny(
        self,
        session: AgentSession,
        rs: pb.RunStarted,
        tenant: str,
        reason: str,
        detail: str,
        util: float | None = None,
        metric: str | None = None,
    ) -> None:
        self.stats["denied"] += 1
        record = decision_record(
            rs.run_id, tenant, rs.agent, "deny", reason, detail, util, metric, "guard"
        )
        session.push(record, request_id=rs.request_id)

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
        self._check_id(rs.run_id)
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
        if self.table.full() and not self._make_room():
            self.stats["capacity_rejections"] += 1
            self._deny(
                session,
                rs,
                tenant,
                Reason.ERROR.value,
                f"guard at capacity: {len(self.runs)} tracked runs (max_tracked_runs="
                f"{self.max_runs})",
            )
            return
        if not restoring and (cancelling := self.cancelling(tenant, rs.agent)) is not None:
            # a fleet cancel by selector is being carried out: a matching new run is denied
            self._deny(session, rs, tenant, Reason.OPERATOR_CANCEL.value, cancelling)
            return
        parent = self.runs.get(rs.parent_run_id) if rs.parent_run_id else None
        root = parent is None or parent.tenant != tenant
        seen = (spend_of(reg.restored) or (0.0, 0.0)) if root else None
        self.budgets.admit(tenant, rs.run_id, functools.partial(self._admitted, reg), grant=seen)

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
            self._deny(session, rs, tenant, Reason.ERROR.value, "run_id is already in use")
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
                self._deny(session, rs, tenant, Reason.ERROR.value, "run_id already ended")
            return True
        return False

    def _admitted(self, reg: _Registration, verdict: Decision) -> None:
        """The tenant's verdict on a registration: deny, or make the run and Admit it."""
        session, rs, tenant, restoring = reg.session, reg.rs, reg.tenant, reg.restoring
        if not verdict.stop and (session.closed or self._answered(reg)):
            # Not this registration's slot after all. A run of that id that is live now (a
            # repeated RunStarted) holds the fleet's slot and grant: only the local count.
            self.budgets.run_ended(tenant, "" if rs.run_id in self.runs else rs.run_id)
            return
        # A Hello entry still waiting for its first answer (request_id set) was never
        # admitted: denied like a new run, not admitted-then-cancelled (its agent would start
        # it, with no ceilings, until the cancel lands).
        if verdict.stop and (not restoring or rs.request_id):
            why = (verdict.reason or Reason.TENANT_BUDGET).value  # error: budgets unavailable
            self._deny(
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
        effective = self.config.effective_limits(reg.requested)
        run = self._new_run(
            rs.run_id,
            tenant=tenant,
            agent=rs.agent,
            parent_run_id=rs.parent_run_id,
            trace=reg.trace,
            started_at=rs.started_at_unix or time.time(),
            limits=effective,
            session=session,
            admitted=not verdict.stop,
            restoring=restoring,
        )
        if reg.restored is not None:
            self._restore_usage(run, reg.restored)
        if (restoring and rs.span_seq) or waiting is not None:
            # spans numbered <= span_seq are in the restored usage; each later one counts once
            run.seq_gate = SeqGate(rs.span_seq if restoring else 0)
        self._admit_msg(session, run, rs.request_id)
        if waiting is not None:
            self._adopt(run, waiting, kept, reg.principal)
        # A fleet cancel that matches it: a re-registered run stops now; a new run admitted
        # while the fleet's verdict was on its way (the cancel began meanwhile) too.
        cancelling = self.cancelling(tenant, rs.agent)
        if cancelling is not None:
            self.stop_run(run, Reason.OPERATOR_CANCEL, cancelling, None, None, DecidedBy.OPERATOR)
        elif verdict.stop:  # re-registered into an exhausted tenant: it must stop now
            self.stop_run(
                run,
                verdict.reason or Reason.TENANT_BUDGET,
                verdict.message,
                verdict.utilisation,
                verdict.metric,
                DecidedBy.GUARD,
            )

    def _new_run(
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
        kw: dict[str, Any] = {}
        if age > 1.0:
            base = self.clock

            def clock(base: Callable[[], float] = base, age: float = age) -> float:
                return base() + age

            kw["clock"] = clock
        else:
            kw["clock"] = self.clock
        budget = Budget(limits, parent=parent.budget if parent else None, **kw)
        now = self.clock()
        run = RunState(
            run_id,
            tenant=tenant,
            agent=agent,
            parent_run_id=parent_run_id,
            trace_id=trace,
            started_at=started_at,
            budget=budget,
            loop=LoopDetector(limits.loop),
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
        session.send("admit", admit_to_pb(run.run_id, request_id, run.budget.limits, version))

    def _attach(self, run: RunState, session: AgentSession) -> None:
        run.remote = None  # guarded here as another replica's run until now: ours again
        self.directory.claim(run, session)
        run.detached_at = None
        run.touched_at = self.clock()
        self.table.attached(run)
        if run.stop_reason is not None:  # a cancel it may have missed while away
            session.cancel(run.run_id, run.stop_reason.value, run.stop_detail)

    def _make_room(self) -> bool:
        """At the cap: forget the stalest span-only run (it has no agent to answer to)."""
        stalest = self.table.stalest_span_only()
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
        self._ended_elsewhere(hello.ended_runs, tenant)
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
            self.check_deadline(run)

    def get(self, run_id: str, principal: Principal | None = None) -> RunState:
        """The live run ``run_id``; another tenant's run (for ``principal``) is answered
        exactly like an unknown one."""
        run = self.runs.get(run_id)
        if run is None or (
            principal is not None
            and principal.tenant is not None
            and run.tenant != principal.tenant
        ):
            raise UnknownRun(f"run {run_id[:64]!r} is not live on this guard")
        return run
