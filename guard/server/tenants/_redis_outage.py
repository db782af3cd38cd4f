"""How a replica's shared tenant budgets ride out a Redis that does not answer.

The outage half of :class:`~guard.server.tenants._redis.SharedTenantBudgets` (which mixes
in :class:`FailOpen`):

**Redis unreachable** (:class:`~guard.errors.StateUnavailable`, fast: see ``StateClient``):
the replica enforces its own local windows and caps (fail-open), logs the outage once and
counts it (``Stats`` ``redis_fail_open_periods``, the ``otel_guard.fail_open.*`` metrics),
and keeps what it counted meanwhile (usage, admissions) in a
:class:`~guard.server._redis.PendingUsage`. With ``guard.fail_closed: true`` new runs are
denied instead (reason ``error``: the tenant's budget is not what is short, and a
``tenant_budget`` denial would tell its operator to wait for a window that is not full);
live runs go on under the local windows. On the first answer after the outage the pending
usage is reconciled into Redis once (it leaves the buffer only when Redis acknowledged it)
and the live runs' slots are claimed again. Slots freed during the outage lapse with their
lease.

**A blip is not an outage.** For the first :data:`HOLD_S` of an outage (one reply slower
than the client's timeout, a Redis failover) new admissions, allowance asks and ended runs'
frees wait for Redis (retried every ``_DOWN_TICK_S`` of ``_redis`` once the client's
fast-fail pause is over) instead of being answered from this replica's own view: that view
has neither the other replicas' spend nor the grants the fleet holds, so its answers would
grant the tenant's window a second time. Only a longer outage is answered locally
(fail-open, as above). An agent that stops waiting first falls back on its own (counted by
the SDK).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from guard.errors import StateUnavailable
from guard.policy import CONTINUE, Action, Decision, Reason

if TYPE_CHECKING:  # pragma: no cover
    from guard.server.tenants._interface import TenantsHost, Verdict
    from guard.server.tenants._local import LocalTenantBudgets
    from guard.server.tenants._redis_budgets import RedisTenantBudgets
    from guard.server.tenants._redis_pending import PendingUsage

__all__ = ["HOLD_S", "FailOpen"]

log = logging.getLogger("guard.server")
# An outage younger than this is a blip: admissions and asks wait for Redis (the client's
# fast-fail pause, StateClient.retry_after_s = 0.5 s, is over before it: one retry at least)
HOLD_S = 1.0


class FailOpen:
    """The outage state of shared tenant budgets and what it answers (module docstring).

    A mixin: the class that uses it sets the attributes annotated here."""

    registry: TenantsHost
    local: LocalTenantBudgets
    remote: RedisTenantBudgets
    pending: PendingUsage
    fail_closed: bool
    down: bool
    down_since: float

    @property
    def local_answers(self) -> bool:
        """Whether this replica's own view answers admissions and allowance asks: only once
        Redis has been unreachable for ``HOLD_S`` (a real outage: fail-open, or fail_closed).
        Before that (a blip: one slow reply, a failover of Redis) they wait for Redis."""
        return self.down and time.monotonic() - self.down_since >= HOLD_S

    def _resolve(self, then: Verdict, verdict: Decision) -> None:
        # another stream's registration may be resolved here: its failure is not this one's
        try:
            then(verdict)
        except Exception:
            log.exception("guard: applying a tenant's admission verdict failed")

    def _closed_denial(self, tenant: str) -> Decision:
        """``guard.fail_closed`` without the fleet: give back the local slot the admission
        took, count the denial, and say why."""
        self.local.tenants.run_ended(tenant)
        self.registry.stats["redis_fail_closed_denials"] += 1
        return self._unavailable()

    def _fail_open_admit(self, tenant: str, then: Verdict) -> None:
        if self.fail_closed:
            self._resolve(then, self._closed_denial(tenant))
            return
        self.registry.stats["redis_fail_open_admits"] += 1
        self.pending.add(tenant, runs=1)  # its admission goes into the runs windows later
        self._resolve(then, CONTINUE)

    def _unavailable(self) -> Decision:
        where = self.remote.client.url.rsplit("@", 1)[-1].split("://", 1)[-1]  # no password
        return Decision(
            Action.STOP,
            reason=Reason.ERROR,
            message=f"tenant budgets unavailable: redis {where} unreachable (guard.fail_closed)",
        )

    def _telemetry(self) -> Any:
        metrics = getattr(self.registry, "metrics", None)  # set by GuardServer when enabled
        return None if metrics is None else metrics.redis()

    def _unreachable(self, exc: BaseException) -> None:
        telemetry = self._telemetry()
        if telemetry is not None:
            telemetry.error(type(exc.__cause__ or exc).__name__)
            telemetry.fail_open(True)
        if self.down:
            return  # logged and counted once per outage
        self.down = True
        self.down_since = time.monotonic()
        self.registry.stats["redis_fail_open_periods"] += 1
        mode = "denying new runs (guard.fail_closed)" if self.fail_closed else "fail-open"
        log.warning(
            "tenant budgets: %s; enforcing this replica's local windows, %s, until it answers",
            exc,
            mode,
        )

    async def _recovered(self) -> None:
        """Redis answers again: reconcile what was counted meanwhile (once), claim again
        the live runs' slots."""
        self.down = False
        telemetry = self._telemetry()
        if telemetry is not None:
            telemetry.fail_open(False)
        live = self._live()
        try:
            n = await self.pending.flush(self.remote, lambda t: live.get(t, ()))
            await self.remote.heartbeat(live, claim=True)
        except StateUnavailable as exc:
            self._unreachable(exc)
            return
        self.registry.stats["redis_reconciled_tenants"] += n
        log.warning("tenant budgets: redis answers again; reconciled %d tenants", n)

    def _live(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for run in self.registry.runs.values():
            if run.admitted:
                out.setdefault(run.tenant, []).append(run.run_id)
        return out
