"""The tenant budgets seam: every tenant's rolling windows, concurrency slots and allowances.

One guard process keeps them in memory (:class:`~guard.server.tenants._local.LocalTenantBudgets`);
replicas (``otel-guard serve --redis``) share them through Redis
(:class:`~guard.server.tenants._redis.SharedTenantBudgets`). The callers (the span applier, the
registry, the decision router, the servicers) only see this interface.

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
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from guard.policy import Decision, Outcome, PolicyConfig, TenantBudget, Usage
    from guard.server.control._fanout import AgentSession
    from guard.server.decode._schema import Observation
    from guard.server.runs._state import RunState
    from guard.server.runtime._auth import Principal
    from guard.v1 import guard_pb2 as pb

__all__ = ["Spent", "TenantBudgets", "TenantsHost", "Verdict"]


Verdict = Callable[["Decision"], None]  # told the tenant's verdict on an admission
Spent = tuple[float, float] | None  # (cost_usd, tokens) a run spent, or no grant asked


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


class TenantsHost(Protocol):
    """What an implementation of tenant budgets may use of the guard that owns it (the run
    registry): nothing more, so a part can be built and tested on its own."""

    config: PolicyConfig
    clock: Callable[[], float]
    runs: dict[str, RunState]  # the live runs, read-only to the part
    stats: dict[str, int]  # the guard's counters (Stats), which a part adds its own to

    def tenant_cut(self, tenant: str, d: Decision) -> None:
        """The fleet exhausted a window of ``tenant``: stop its runs."""
