"""The guard's shared-state seams: tenant budgets, the run directory and the directive bus.

One guard process keeps all three in memory (:func:`local_parts`, today's behaviour). Several
replicas (``otel-guard serve --redis``) share them: a Redis implementation of each interface
is chosen at start instead, by the factory :class:`~guard.server.GuardServer` hands to the
registry. The callers (the span applier, the registry, the decision router, the servicers)
only see the interfaces.

**Where an await can happen.** The registry runs on the event loop and never awaits: every
method below is synchronous and must return at once, from a local view. A shared
implementation keeps that view and settles it with the shared store in :meth:`TenantBudgets.sync`,
which is the one coroutine of these interfaces: the OTLP handler awaits it once after each
Export request (after ``registry.ingest``) and the control reader after each message it
applied. So a Redis implementation makes one round trip per Export request per tenant: the
span applier sums a request's usage per tenant and calls :meth:`TenantBudgets.record` once
per tenant (never per span); the implementation applies the delta to its local windows (the
decision is taken from them) and queues it; ``sync`` sends the queued deltas (one script per
tenant), reads back the fleet's sums, and reports a window the fleet exhausted through the
``on_exhausted`` callback it was built with (the registry's ``tenant_cut``). The in-memory
implementation has nothing to settle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from guard.policy import Decision, Outcome, TenantBudget, Usage
    from guard.records import DecisionRecord
    from guard.server._auth import Principal
    from guard.server._fanout import AgentSession
    from guard.server._schema import Observation
    from guard.server._state import RunState
    from guard.v1 import guard_pb2 as pb

__all__ = [
    "DirectiveBus",
    "LocalBus",
    "LocalDirectory",
    "LocalTenantBudgets",
    "Lost",
    "Parts",
    "PartsFactory",
    "RunDirectory",
    "Spent",
    "TenantBudgets",
    "Verdict",
    "local_parts",
    "parts_for",
]


Verdict = Callable[["Decision"], None]  # told the tenant's verdict on an admission
Spent = tuple[float, float] | None  # (cost_usd, tokens) a run spent, or no grant asked
Lost = Callable[["RunState", bool], None]  # told whether a lost run moved to another replica


class TenantBudgets(Protocol):
    """Every tenant's rolling windows, concurrency slots and allowances.

    Synchronous except :meth:`sync` (see the module docstring). ``Decision.stop`` with
    reason tenant_budget means the tenant is exhausted (deny the run, or stop its runs).
    """

    # -- runs ------------------------------------------------------------------------------
    def admit(self, tenant: str, run_id: str, then: Verdict, *, grant: Spent = None) -> None:
        """Take a concurrency slot for the new run ``run_id`` of ``tenant``, or say why not:
        ``then(decision)`` is called with the verdict, at once from a local view, or from
        :meth:`sync` when the slot is the fleet's (the run is admitted only then). A run that
        holds its slot already (it re-registered) keeps it. ``grant``: a root run, whose
        allowance grant may come with its admission (see :meth:`on_admit`): what it spent
        so far (cost_usd, tokens: zero, or a re-registered run's snapshot)."""

    def run_ended(self, tenant: str, run_id: str = "") -> None:
        """Give back the slot of a run that was admitted (``run_id``: a run that never got
        as far as the registry, e.g. its stream closed while its admission was settled)."""

    # -- usage -----------------------------------------------------------------------------
    def record(self, tenant: str, usage: Usage) -> Decision:
        """Add one request's summed usage of ``tenant`` (or a re-registered run's snapshot) to
        its windows: one call per request per tenant, never per span."""

    def restore(self, tenant: str, usage: Usage) -> None:
        """A re-registered root run's snapshot: into the windows that did not count it yet
        (in memory: this process's, after a restart; shared: the fleet counted it already,
        so only the local view)."""

    def wants_usage(self, tenant: str) -> bool:
        """Whether any window of ``tenant`` counts usage (cheap; the span path asks)."""

    def exhausted(self, tenant: str) -> tuple[str, float, float] | None:
        """(metric, used, limit) of a window of ``tenant`` that is full, else ``None``."""

    def known(self) -> list[str]:
        """Tenants with a budget: the policy file's and those seen on the wire."""

    def status(self, tenant: str) -> pb.TenantBudget:
        """The tenant's windows, slots and exhaustion, from the view as of the last sync."""

    async def fleet_status(self, tenant: str) -> pb.TenantBudget:
        """``GuardAdmin.TenantBudgets``: :meth:`status`, read fresh from the shared store
        (the view when it does not answer)."""

    def budget(self, tenant: str) -> TenantBudget | None:
        """The policy's budget object of ``tenant`` (``None`` beyond the tenants cap)."""

    # -- allowances (the tenant's windows handed out to live runs) ----------------------------
    def on_admit(self, run: RunState, session: AgentSession) -> None:
        """Before a run's Admit: push its first grant (or the one it holds)."""

    def request(self, session: AgentSession, req: pb.AllowanceRequest, principal: Principal):
        """An ``AllowanceRequest`` of a run on ``session``: grant more, or say exhausted."""

    def observe(self, runs: Any) -> None:
        """After a request: these runs spent; their grants move into the windows."""

    def release(self, run: RunState, outcome: Outcome | None = None) -> None:
        """The run ended (any way; called once per run, with the agent's ``outcome`` when it
        sent RunEnded): its grant goes back, but for its announced tail."""

    def late_span(self, o: Observation, scope: str | None, spent: dict[str, Usage]) -> bool:
        """A span of an ended run: add it to ``spent`` (its tenant's usage this request)."""

    def renew(self) -> None:
        """Housekeeping (the sweep): expire tails, re-push the live runs' grants."""

    async def sync(self) -> None:
        """Settle the local view with the shared store; the only await point."""

    #: Whether :meth:`sync` has anything to settle (False: the callers need not await it).
    settles: bool


class RunDirectory(Protocol):
    """Which agent session holds each run's control stream."""

    def holder(self, run_id: str) -> AgentSession | None:
        """The connected session holding ``run_id``'s stream on this replica, if any."""

    def claim(self, run: RunState, session: AgentSession) -> None:
        """``session`` now holds ``run``'s stream."""

    def release(self, run: RunState) -> None:
        """``run``'s stream is no longer held by its session (it ended or moved)."""

    def watch(self, run: RunState) -> None:
        """Spans made ``run`` (provisional) before its agent registered it here: find out
        whether another replica holds its stream (then ``registry.located(run, entry)``)."""

    def confirm_lost(self, runs: list[RunState], then: Lost) -> None:
        """``runs`` waited past ``agent_grace_s`` for their agents (detached, or provisional
        runs nobody registered): before their records say agent_lost, ask who holds each
        stream *now*. A run another live replica holds is handed over to it (a detached run
        through ``registry.moved_away``, a provisional one through ``registry.located``), so
        that replica writes its one record; ``then(run, moved)`` follows for every run, with
        ``moved`` False when no other replica holds it (the caller ends it). At once in one
        process; with replicas, after one round trip for all of ``runs``."""


class DirectiveBus(Protocol):
    """Carries a decision to whichever process holds the run's stream."""

    def deliver(self, run: RunState, record: DecisionRecord) -> bool:
        """Push the decision ``record`` to ``run``'s agent; False when nobody holds its
        stream (the caller then writes the record itself)."""


@dataclass(frozen=True, slots=True)
class Parts:
    """The shared-state parts of one registry, chosen at start.

    A part may have background work (a Redis heartbeat, a bus subscriber): it then defines
    ``async start()`` and ``async close()``, which :meth:`start` and :meth:`close` call, once
    each, when the guard starts serving and after it drained.
    """

    budgets: TenantBudgets
    directory: RunDirectory
    bus: DirectiveBus

    async def start(self) -> None:
        for part in self._distinct():
            start = getattr(part, "start", None)
            if start is not None:
                await start()

    async def close(self) -> None:
        for part in reversed(self._distinct()):
            close = getattr(part, "close", None)
            if close is not None:
                await close()

    def _distinct(self) -> list[Any]:
        # one object may implement several seams (it is started and closed once)
        out: list[Any] = []
        for part in (self.budgets, self.directory, self.bus):
            if all(part is not p for p in out):
                out.append(part)
        return out


class LocalTenantBudgets:
    """One process's tenant budgets: :class:`~guard.server._tenants.Tenants` (windows and
    slots) and :class:`~guard.server._allowances.Allowances` (grants), in memory."""

    settles = False  # one process: sync() has nothing to do

    def __init__(self, registry: Any) -> None:
        from guard.server._allowances import Allowances
        from guard.server._tenants import Tenants

        self.tenants = Tenants(registry.config, clock=registry.clock)
        self.allowances = Allowances(registry, self.tenants)
        t, a = self.tenants, self.allowances
        self.record = t.record
        self.restore = t.record  # a restarted guard's windows start empty: count it again
        self.wants_usage = t.wants_usage
        self.exhausted = t.exhausted
        self.known = t.known
        self.status = t.to_pb
        self.budget = t.budget
        self.on_admit = a.on_admit
        self.request = a.request
        self.observe = a.observe
        self.release = a.release
        self.late_span = a.late_span
        self.renew = a.renew

    def admit(self, tenant: str, run_id: str, then: Verdict, *, grant: Spent = None) -> None:
        then(self.tenants.admit(tenant))

    def run_ended(self, tenant: str, run_id: str = "") -> None:
        self.tenants.run_ended(tenant)

    async def fleet_status(self, tenant: str) -> pb.TenantBudget:
        return self.status(tenant)

    async def sync(self) -> None:
        """Nothing to settle: this process is the only one."""


class LocalDirectory:
    """The directory of one process: each run's session, kept on the run and its session."""

    def __init__(self, registry: Any) -> None:
        self._runs = registry.runs

    def holder(self, run_id: str) -> AgentSession | None:
        run = self._runs.get(run_id)
        return run.session if run is not None and run.connected else None

    def claim(self, run: RunState, session: AgentSession) -> None:
        if run.session is not None and run.session is not session:
            run.session.runs.discard(run.run_id)
        run.session = session
        session.runs.add(run.run_id)

    def release(self, run: RunState) -> None:
        if run.session is not None:
            run.session.runs.discard(run.run_id)

    def watch(self, run: RunState) -> None:
        """One process: no other replica can hold it."""

    def confirm_lost(self, runs: list[RunState], then: Lost) -> None:
        """One process: no other replica can hold them."""
        for run in runs:
            then(run, False)


class LocalBus:
    """In-process delivery: the run's own :class:`AgentSession` queues the directive."""

    def deliver(self, run: RunState, record: DecisionRecord) -> bool:
        if run.connected:
            run.session.push(record)
            return True
        return False


def local_parts(registry: Any) -> Parts:
    """The in-memory parts (one guard process): today's behaviour."""
    return Parts(LocalTenantBudgets(registry), LocalDirectory(registry), LocalBus())


PartsFactory = Callable[[Any], Parts]


def parts_for(config: Any, *, redis_url: str | None = None, guard_id: str = "") -> PartsFactory:
    """The parts a guard started with ``config`` uses: in memory (one process), or shared
    through Redis when ``redis_url`` is given (``serve --redis``; this guard is then the
    replica ``guard_id`` of several). redis-py is imported only in the second case."""
    if redis_url is None:
        return local_parts
    from guard.server._redis import redis_parts

    return redis_parts(config, redis_url, guard_id=guard_id)
