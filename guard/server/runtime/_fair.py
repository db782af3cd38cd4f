"""Per-tenant turns for work that yields to the event loop between slices.

A large request (a multi-chunk OTLP Export, a Hello re-registering thousands of runs) is
processed in slices, so no single message holds the loop. But slices of *concurrent*
requests of one tenant still queue in the loop's ready queue one after the other, and
another tenant's cancel waits behind all of them. A :class:`TenantTurns` lets one sliced
request per tenant run at a time: the others wait on a lock, which costs the loop nothing,
so a tenant's flood delays another tenant by about one slice per turn of the loop instead of
one slice per request in flight. The loop is single-threaded, so this costs no throughput.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

__all__ = ["MAX_TENANT_TURNS", "TenantTurns"]

MAX_TENANT_TURNS = 10_000  # tenants whose lock is kept; idle ones beyond it are dropped


class TenantTurns:
    """One asyncio lock per tenant (``None`` = the single principal of an auth-less guard).

    Only for the server's event loop. The map is bounded: at the cap, the least recently
    used unlocked lock is forgotten (a lock that is held or waited on is never dropped).
    """

    def __init__(self, cap: int = MAX_TENANT_TURNS) -> None:
        self._locks: OrderedDict[str | None, asyncio.Lock] = OrderedDict()
        self._cap = cap

    def turn(self, tenant: str | None) -> asyncio.Lock:
        """The lock to hold while processing ``tenant``'s sliced request."""
        lock = self._locks.get(tenant)
        if lock is not None:
            self._locks.move_to_end(tenant)
            return lock
        if len(self._locks) >= self._cap:
            for key, old in self._locks.items():
                if not old.locked():
                    del self._locks[key]
                    break
        lock = self._locks[tenant] = asyncio.Lock()
        return lock
