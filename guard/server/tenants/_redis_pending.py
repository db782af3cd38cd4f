"""Usage counted locally while Redis was unreachable, kept until Redis has it.

While :class:`~guard.server._redis.RedisTenantBudgets` raises ``StateUnavailable`` the guard
enforces with its local windows (fail-open) and adds each tenant's usage and admissions
here. :meth:`PendingUsage.flush` hands them to Redis when it answers again, and a tenant's
entry is removed only after the call that carried it returned: nothing is dropped before
the write (LiteLLM #33872 popped its buffer first and lost it when the commit failed). A
flush that fails keeps everything; as the failed call may have been applied before the
connection broke, the next flush can count that part twice (over-counting, never losing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from guard.policy import Usage
from guard.server.tenants._redis_budgets import RecordBatch, RedisTenantBudgets

__all__ = ["PendingUsage"]


class PendingUsage:
    """Per-tenant usage and admissions not yet in Redis (owned by one event loop)."""

    def __init__(self) -> None:
        self._usage: dict[str, Usage] = {}
        self._runs: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._usage.keys() | self._runs.keys())

    def add(self, tenant: str, delta: Usage | None = None, *, runs: int = 0) -> None:
        if delta is not None:
            self._usage.setdefault(tenant, Usage()).add(delta)
        if runs:
            self._runs[tenant] = self._runs.get(tenant, 0) + runs

    def peek(self, tenant: str) -> tuple[Usage | None, int]:
        return self._usage.get(tenant), self._runs.get(tenant, 0)

    async def flush(
        self, budgets: RedisTenantBudgets, live: Callable[[str], Iterable[str]] = lambda t: ()
    ) -> int:
        """Send every tenant's pending usage (one pipeline) and re-claim the slots of its
        ``live`` runs; returns how many tenants went. Raises ``StateUnavailable`` (and keeps
        all) when Redis fails meanwhile."""
        usage, runs = self._usage, self._runs
        tenants = sorted(usage.keys() | runs.keys())
        if not tenants:
            return 0
        # In flight until acknowledged: a failure puts it all back (a processing queue with
        # requeue); usage added meanwhile goes to fresh maps and is not lost either.
        self._usage, self._runs = {}, {}
        try:
            await budgets.record_many(
                {t: RecordBatch(usage.get(t), runs=runs.get(t, 0)) for t in tenants}
            )
        except BaseException:
            for t, u in usage.items():
                self.add(t, u)
            for t, n in runs.items():
                self.add(t, runs=n)
            raise
        # acknowledged: only now it leaves the buffer; the slots are re-claimed best-effort
        await budgets.heartbeat({t: live(t) for t in tenants}, claim=True)
        return len(tenants)
