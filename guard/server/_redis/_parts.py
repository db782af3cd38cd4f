"""The parts of a replica (``serve --redis``): which Redis implementation backs each seam.

:func:`redis_parts` is what :func:`guard.server._parts.parts_for` returns for a Redis URL. Each
registry gets its own :class:`StateClient` (one connection pool to the shared Redis); a part
with background work starts and closes with the guard (``Parts.start``/``close``).

* tenant budgets: :class:`~guard.server.tenants._redis.SharedTenantBudgets` (windows, slots and
  allowance grants in Redis, a local view settled once per request);
* the run directory: :class:`~guard.server.directory._redis.RedisDirectory`;
* the directive bus: :class:`~guard.server.bus._redis.RedisBus`, which also carries the
  fleet's ``GuardAdmin`` queries (:mod:`guard.server.admin._fleet`).

The budgets part closes the shared :class:`StateClient`; ``Parts.close`` closes the parts in
reverse order, so it goes last.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from guard.server._parts import Parts, PartsFactory
from guard.server._redis._client import StateClient
from guard.server.admin._fleet import Fleet
from guard.server.bus._redis import RedisBus
from guard.server.directory._redis import RedisDirectory
from guard.server.tenants._redis import SharedTenantBudgets

if TYPE_CHECKING:  # pragma: no cover
    from guard.server.runs._registry import Registry

__all__ = ["redis_parts"]


def redis_parts(config: Any, url: str, *, guard_id: str) -> PartsFactory:
    """A factory of the Redis-backed parts of the replica ``guard_id``."""

    def build(registry: Registry) -> Parts:
        state = StateClient(url, socket_timeout_ms=config.guard.redis_timeout_ms)
        registry.state = state  # the replica's connection (metrics, Stats, tests)
        budgets = SharedTenantBudgets(registry, state)
        directory = RedisDirectory(registry, state, guard_id=guard_id)
        bus = RedisBus(registry, state, guard_id=guard_id)
        bus.fleet = Fleet(registry, directory, bus)  # GuardAdmin through any replica
        return Parts(budgets, directory, bus)

    return build
