"""Tenant budgets: one policy ``TenantBudget`` per tenant, built from the policy file.

The rolling windows and the concurrency cap are the policy engine's; this module only keeps
the map, caps how many tenants are tracked (tenant names come from the wire), and turns
status into ``guard.v1.TenantBudget`` messages.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from guard.policy import CONTINUE, Decision, PolicyConfig, TenantBudget, Usage
from guard.wire import tenant_budget_to_pb

if TYPE_CHECKING:  # pragma: no cover
    from guard.policy import Outcome
    from guard.server.control._fanout import AgentSession
    from guard.server.decode._schema import Observation
    from guard.server.runs._state import RunState
    from guard.server.runtime._auth import Principal
    from guard.server.tenants._interface import Spent, TenantsHost, Verdict
    from guard.v1 import guard_pb2 as pb

__all__ = ["AllowanceHooks", "LocalTenantBudgets", "Tenants"]

MAX_TENANTS = 10_000


class Tenants:
    """All tenant budgets of one guard. Runs on the event loop (TenantBudget is not shared)."""

    def __init__(self, config: PolicyConfig, *, clock: Callable[[], float] = time.monotonic):
        self._config = config
        self._clock = clock
        self._budgets: dict[str, TenantBudget] = {}
        # tenants whose limits track nothing per usage: skip the Usage allocation per span
        self._passive: set[str] = set()

    def _get(self, tenant: str) -> TenantBudget | None:
        tb = self._budgets.get(tenant)
        if tb is None:
            if len(self._budgets) >= MAX_TENANTS:
                return None
            limits = self._config.tenant_limits(tenant)
            tb = TenantBudget(tenant, limits)
            self._budgets[tenant] = tb
            if not any(r.metric != "runs" for r in limits.rolling):
                self._passive.add(tenant)
        return tb

    def budget(self, tenant: str) -> TenantBudget | None:
        """The tenant's budget (``None`` beyond the tracked-tenants cap)."""
        return self._get(tenant)

    def admit(self, tenant: str) -> Decision:
        """Count a new run against the tenant, or say why not (STOP / tenant_budget)."""
        tb = self._get(tenant)
        if tb is None:
            return CONTINUE
        return tb.admit(self._clock())

    def run_ended(self, tenant: str) -> None:
        tb = self._budgets.get(tenant)
        if tb is not None and tb.live_runs > 0:
            tb.run_ended()

    def record(self, tenant: str, delta: Usage) -> Decision:
        """Add usage to the tenant's windows; STOP/tenant_budget once a window is reached."""
        if tenant in self._passive:
            return CONTINUE
        tb = self._get(tenant)
        if tb is None:
            return CONTINUE
        return tb.record(self._clock(), delta)

    def wants_usage(self, tenant: str) -> bool:
        """Whether usage deltas of this tenant feed any rolling window (cheap check)."""
        if tenant in self._passive:
            return False
        tb = self._get(tenant)
        return tb is not None and tenant not in self._passive

    def exhausted(self, tenant: str) -> tuple[str, float, float] | None:
        tb = self._budgets.get(tenant)
        return None if tb is None else tb.exhausted(self._clock())

    def known(self) -> list[str]:
        names = set(self._budgets) | set(self._config.tenants)
        return sorted(names)

    def to_pb(self, tenant: str) -> Any:
        """``guard.v1.TenantBudget`` of the tenant (see ``wire.tenant_budget_to_pb``)."""
        tb = self._get(tenant)
        if tb is None:
            return tenant_budget_to_pb(tenant)
        now = self._clock()
        limits: Any = self._config.tenant_limits(tenant)
        return tenant_budget_to_pb(
            tenant,
            live_runs=tb.live_runs,
            max_concurrent_runs=limits.max_concurrent_runs,
            windows=tb.status(now),
            exhausted=tb.exhausted(now) is not None,
        )


class AllowanceHooks:
    """The allowance hooks of the ``TenantBudgets`` seam, handed to its allowance desk
    (``allowances``): the in-memory one, or a replica's grants out of the fleet's windows."""

    allowances: Any

    def on_admit(self, run: RunState, session: AgentSession) -> None:
        self.allowances.on_admit(run, session)

    def request(self, session: AgentSession, req: pb.AllowanceRequest, principal: Principal) -> Any:
        return self.allowances.request(session, req, principal)

    def observe(self, runs: Any) -> None:
        self.allowances.observe(runs)

    def renew(self) -> None:
        self.allowances.renew()


class LocalTenantBudgets(AllowanceHooks):
    """One process's tenant budgets: :class:`Tenants` (windows and slots) and
    :class:`~guard.server.tenants._allowances.Allowances` (grants), in memory. The
    :class:`~guard.server.tenants._interface.TenantBudgets` of one guard, and the local view of
    a replica's shared ones."""

    settles = False  # one process: sync() has nothing to do

    def __init__(self, registry: TenantsHost) -> None:
        # imported here: the allowance desk reads the registry's parts, built from this module
        from guard.server.tenants._allowances import Allowances

        self.tenants = Tenants(registry.config, clock=registry.clock)
        self.allowances: Allowances = Allowances(registry, self.tenants)

    # -- runs ------------------------------------------------------------------------------
    def admit(self, tenant: str, run_id: str, then: Verdict, *, grant: Spent = None) -> None:
        then(self.tenants.admit(tenant))

    def run_ended(self, tenant: str, run_id: str = "") -> None:
        self.tenants.run_ended(tenant)

    # -- usage -----------------------------------------------------------------------------
    def record(self, tenant: str, usage: Usage) -> Decision:
        return self.tenants.record(tenant, usage)

    def restore(self, tenant: str, usage: Usage) -> None:
        self.tenants.record(tenant, usage)  # a restarted guard's windows start empty

    def wants_usage(self, tenant: str) -> bool:
        return self.tenants.wants_usage(tenant)

    def exhausted(self, tenant: str) -> tuple[str, float, float] | None:
        return self.tenants.exhausted(tenant)

    def known(self) -> list[str]:
        return self.tenants.known()

    def status(self, tenant: str) -> pb.TenantBudget:
        return self.tenants.to_pb(tenant)

    async def fleet_status(self, tenant: str) -> pb.TenantBudget:
        return self.status(tenant)

    def budget(self, tenant: str) -> TenantBudget | None:
        return self.tenants.budget(tenant)

    # -- allowances (on_admit, request, observe, renew: AllowanceHooks) ---------------------
    def release(self, run: RunState, outcome: Outcome | None = None) -> None:
        self.allowances.release(run, outcome)

    def late_span(self, o: Observation, scope: str | None, spent: dict[str, Usage]) -> bool:
        return self.allowances.late_span(o, scope, spent)

    async def sync(self) -> None:
        """Nothing to settle: this process is the only one."""
