"""The shared-state parts of one guard: tenant budgets, the run directory and the directive bus.

One guard process keeps all three in memory (:func:`local_parts`). Several replicas
(``otel-guard serve --redis``) share them: the Redis implementation of each interface is
chosen at start instead (:func:`parts_for`), and the callers only see the interfaces
(:mod:`guard.server.tenants._interface`, :mod:`guard.server.directory._interface`,
:mod:`guard.server.bus._interface`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from guard.server.bus._interface import DirectiveBus
from guard.server.bus._local import LocalBus
from guard.server.directory._interface import RunDirectory
from guard.server.directory._local import LocalDirectory
from guard.server.tenants._interface import TenantBudgets
from guard.server.tenants._local import LocalTenantBudgets

__all__ = ["Parts", "PartsFactory", "local_parts", "parts_for"]


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


def local_parts(registry: Registry) -> Parts:
    """The in-memory parts (one guard process): today's behaviour."""
    return Parts(LocalTenantBudgets(registry), LocalDirectory(registry), LocalBus())


PartsFactory = Callable[["Registry"], Parts]


def parts_for(config: Any, *, redis_url: str | None = None, guard_id: str = "") -> PartsFactory:
    """The parts a guard started with ``config`` uses: in memory (one process), or shared
    through Redis when ``redis_url`` is given (``serve --redis``; this guard is then the
    replica ``guard_id`` of several). redis-py is imported only in the second case."""
    if redis_url is None:
        return local_parts
    from guard.server._redis import redis_parts

    return redis_parts(config, redis_url, guard_id=guard_id)


if TYPE_CHECKING:  # pragma: no cover
    from guard.server.bus._redis import RedisBus
    from guard.server.directory._redis import RedisDirectory
    from guard.server.runs._registry import Registry
    from guard.server.tenants._redis import SharedTenantBudgets

    def _conforms(
        lt: LocalTenantBudgets,
        st: SharedTenantBudgets,
        ld: LocalDirectory,
        rd: RedisDirectory,
        lb: LocalBus,
        rb: RedisBus,
    ) -> tuple[
        TenantBudgets, TenantBudgets, RunDirectory, RunDirectory, DirectiveBus, DirectiveBus
    ]:
        """Never called: the type checker holds each implementation, in memory and in Redis,
        to its part's interface."""
        return lt, st, ld, rd, lb, rb
