"""The run registry: every live run, who owns it, and how runs start and end.

Runs enter through ``GuardControl`` (RunStarted, or Hello.live_runs after a reconnect) or,
for agents without a control stream, implicitly from their first span. They leave through
RunEnded, the run span's end (span-only or detached runs), ``agent_lost`` after the grace
period, or an operator cancel of a run whose agent cannot be reached. Every way out writes
exactly one ``Outcome`` to the sink (``ended`` de-duplicates by run id).

The registry lives on the server's event loop; nothing here blocks or awaits. It is a facade
over parts with explicit interfaces, each given what it needs when it is built:

- ``table`` (:class:`~guard.server.runs._table.RunTable`): the runs and their indexes;
- ``applier`` (:class:`~guard.server.applier._applier.SpanApplier`): the span path;
- ``decisions`` (:class:`~guard.server.decisions._router.DecisionRouter`): building and routing
  decisions, stopping runs, operator and fleet cancels;
- ``lifecycle`` (:class:`~guard.server.runs._lifecycle.Lifecycle`): the ways out and the sweep;
- ``rejoin`` (:class:`~guard.server.runs._rejoin.Rejoin`): re-registered, provisional and remote
  runs;
- ``admission`` (:class:`~guard.server.runs._admission.Admission`): registrations and sessions;
- ``budgets``, ``directory``, ``bus`` (:mod:`guard.server._parts`): tenant budgets, the run
  directory and the directive bus, in memory or shared by replicas (chosen at start).

The shared-state parts are built with the registry itself (they call back the public
methods below: ``located``, ``tenant_cut``, ``remote_decision``, ...); the parts here only
see each other through the narrow interfaces they were given.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from guard.policy import PolicyConfig
from guard.server._parts import Parts, PartsFactory, local_parts
from guard.server.applier._applier import SpanApplier
from guard.server.bus._interface import DirectiveBus
from guard.server.control._fanout import AgentSession, DecisionLog
from guard.server.decisions._router import DecisionRouter
from guard.server.decode._schema import Decoded
from guard.server.directory._interface import RunDirectory
from guard.server.runs._admission import Admission
from guard.server.runs._lifecycle import Lifecycle
from guard.server.runs._rejoin import Rejoin
from guard.server.runs._scope import Scope
from guard.server.runs._state import RunState
from guard.server.runs._table import RunTable
from guard.server.runtime._auth import Principal
from guard.server.runtime._ordered import OrderedSet
from guard.server.runtime._status import PermissionDenied, UnknownRun
from guard.server.tenants._interface import TenantBudgets
from guard.wire import run_status_to_hex

__all__ = ["Registry"]

_STATS = (
    "spans",
    "observations",
    "rejected_spans",
    "duplicate_model_calls",
    "foreign_model_calls",
    "late_spans",
    "denied",
    "agent_lost",
    "capacity_rejections",
    "span_runs_rate_limited",
    "replayed_spans",
    "provisional_spans_dropped",
    "adopted_runs",
    "records_acked",
    "records_rejected",  # RunEnded refused on its own (Reject; dead letter)
    "records_clamped",  # RunEnded whose out-of-bounds timestamps took the receive time
)


class Registry:
    """Per-run state for one guard process: builds the parts and keeps the methods the
    servicers, the shared-state parts and the tests call (each is a part's own method,
    bound here once, so the span path pays no extra call)."""

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
        g = config.guard
        self.table = t = RunTable(g.max_tracked_runs, g.max_new_span_runs_per_s, clock)
        # read-only views of the table's maps (only RunTable changes them)
        self.runs, self.by_trace, self.by_tenant = t.runs, t.by_trace, t.by_tenant
        self.detached, self.span_only, self.ended = t.detached, t.span_only, t.ended
        self.max_runs = t.max_runs
        self.sessions: OrderedSet[AgentSession] = OrderedSet()  # in attach order
        self.stats: dict[str, int] = dict.fromkeys(_STATS, 0)
        self.log = DecisionLog(sink, guard_id, self.stats)
        self.applier = SpanApplier(self)
        # tenant budgets, the run directory and the directive bus: in memory, or shared by
        # replicas (see _parts); nothing else here knows which
        self.metrics: Any = None  # the server's GuardMetrics while it serves, if enabled
        self.state: Any = None  # a replica's Redis connection (StateClient), set by its parts
        chosen = parts(self)
        self.parts: Parts = chosen
        self.budgets: TenantBudgets = chosen.budgets
        self.directory: RunDirectory = chosen.directory
        self.bus: DirectiveBus = chosen.bus
        scope = Scope(config, t, clock, self.stats, self.budgets, self.directory)
        self.lifecycle = life = Lifecycle(scope, sink, sessions=self.sessions)
        self.decisions = dec = DecisionRouter(scope, self.bus, self.log, end_run=life.end_run)
        self.rejoin = rej = Rejoin(
            scope,
            decisions=dec,
            ingest=self.ingest,  # through the applier the registry has then (tests swap it)
            forget=life.forget,
        )
        self.admission = adm = Admission(
            scope,
            decisions=dec,
            rejoin=rej,
            forget=life.forget,
            sessions=self.sessions,
        )
        # admission and sessions (the control servicer)
        self.register, self.hello, self.detach = adm.register, adm.hello, adm.detach
        self.ack, self.heartbeat = adm.ack, adm.heartbeat
        self.new_run, self.make_room = adm.new_run, adm.make_room  # the span path's runs
        self.has_room, self.touch = t.has_room, t.touch  # the span path's capacity, LRU
        self.take_span_run = t.span_run_rate.take  # a new run made from spans, at its rate
        # decisions (the span path, the admin servicer, the shared tenant budgets)
        self.act, self.forecast, self.tenant_cut = dec.act, dec.forecast, dec.tenant_cut
        self.check_deadline, self.issue, self.stop_run = dec.check_deadline, dec.issue, dec.stop_run
        self.cancel, self.deny_starts, self.cancelling = dec.cancel, dec.deny_starts, dec.cancelling
        self.remote_decision = dec.remote_decision  # the directive bus
        # the ways out
        self.ended_by_agent, self.end_run = life.ended_by_agent, life.end_run
        self.sweep, self.moved_away = life.sweep, life.moved_away
        # re-registered, provisional and remote runs (the span path, the run directory)
        self.gate, self.set_tenant = rej.gate, rej.set_tenant
        self.located, self.remote_moved = rej.located, rej.remote_moved
        self.ended_remotely = rej.ended_remotely

    @property
    def grace_s(self) -> float:
        """How long a detached run waits for its agent (``agent_grace_s``; the sweep's)."""
        return self.lifecycle.grace_s

    @grace_s.setter
    def grace_s(self, value: float) -> None:
        self.lifecycle.grace_s = float(value)

    @property
    def provisional_spans(self) -> int:
        """Spans held by provisional runs (see ``RunTable.hold``)."""
        return self.table.provisional_spans

    def ingest(self, decoded: Decoded, principal: Principal) -> tuple[int, list[str]]:
        """Apply one OTLP request's observations (see :class:`SpanApplier`). Returns (rejected
        spans, the first error texts)."""
        return self.applier.ingest(decoded, principal)

    def get(self, run_id: str, principal: Principal | None = None) -> RunState:
        """The live run ``run_id``; another tenant's run (for ``principal``) is answered
        exactly like an unknown one."""
        return self.table.live(run_id, principal)

    def fleet_apply(self, query: dict[str, Any]) -> dict[str, Any]:
        """One replica's part of a fleet Cancel / ListRuns (``guard.server.admin._fleet``),
        with the caller's principal: the ids it cancelled, or its runs' statuses."""
        principal = Principal(tenant=query.get("tenant"), admin=bool(query.get("admin")))
        if query.get("op") == "list":
            from guard.server.admin._admin import local_statuses

            statuses, total = local_statuses(
                self, query.get("scope") or "", query.get("agent") or "", int(query["limit"])
            )
            return {"runs": [run_status_to_hex(s) for s in statuses], "total": total}
        target, value, detail = query["target"], query["value"], query.get("detail") or ""
        try:
            ids = self.cancel(target, value, detail, principal)
        except (UnknownRun, PermissionDenied):
            return {"ids": []}
        if target != "run_id":  # after the permission checks (a refused cancel denies nothing)
            self.deny_starts(target, value, principal, detail)
        return {"ids": ids}
