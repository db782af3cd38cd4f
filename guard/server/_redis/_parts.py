"""The parts of a replica (``serve --redis``): which Redis implementation backs each seam.

:func:`redis_parts` is what :func:`guard.server._parts.parts_for` returns for a Redis URL. Each
registry gets its own :class:`StateClient` (one connection pool to the shared Redis); a part
with background work starts and closes with the guard (``Parts.start``/``close``).

The run directory (:class:`~guard.server._redis._directory.RedisDirectory`) and the
directive bus (:class:`~guard.server._redis._bus.RedisBus`, which also carries the fleet's
``GuardAdmin`` queries, :mod:`guard.server._redis._fleet`) are Redis-backed. Interim (issue
12 in progress): the tenant budgets are still the in-memory ones here.
"""

from __future__ import annotations

from typing import Any

from guard.server._parts import LocalTenantBudgets, Parts, PartsFactory
from guard.server._redis._bus import RedisBus
from guard.server._redis._client import StateClient
from guard.server._redis._directory import RedisDirectory
from guard.server._redis._fleet import Fleet

__all__ = ["redis_parts"]


def redis_parts(config: Any, url: str, *, guard_id: str) -> PartsFactory:
    """A factory of the Redis-backed parts of the replica ``guard_id``."""

    def build(registry: Any) -> Parts:
        state = StateClient(url)
        registry.state = state  # the replica's connection (metrics, Stats, tests)
        directory = RedisDirectory(registry, state, guard_id=guard_id)
        bus = RedisBus(registry, state, guard_id=guard_id)
        bus.fleet = Fleet(registry, directory, bus)  # GuardAdmin through any replica
        return Parts(LocalTenantBudgets(registry), directory, bus)

    return build
