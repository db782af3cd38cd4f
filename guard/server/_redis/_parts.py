"""The parts of a replica (``serve --redis``): which Redis implementation backs each seam.

:func:`redis_parts` is what :func:`guard.server._parts.parts_for` returns for a Redis URL. Each
registry gets its own :class:`StateClient` (one connection pool to the shared Redis); a part
with background work starts and closes with the guard (``Parts.start``/``close``).

Interim (issue 12 in progress): the tenant budgets are the Redis-backed
:class:`SharedTenantBudgets`; the run directory and the directive bus are still the in-memory
ones here, each replaced by its Redis implementation as it lands.
"""

from __future__ import annotations

from typing import Any

from guard.server._parts import LocalBus, LocalDirectory, Parts, PartsFactory
from guard.server._redis._client import StateClient
from guard.server._redis._shared import SharedTenantBudgets

__all__ = ["redis_parts"]


def redis_parts(config: Any, url: str, *, guard_id: str) -> PartsFactory:
    """A factory of the Redis-backed parts of the replica ``guard_id``."""

    def build(registry: Any) -> Parts:
        state = StateClient(url)
        registry.state = state  # the replica's connection (metrics, Stats, tests)
        return Parts(SharedTenantBudgets(registry, state), LocalDirectory(registry), LocalBus())

    return build
