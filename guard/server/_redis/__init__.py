"""Shared state of several guard replicas in Redis: the connection (``_client``) and the
factory of a replica's parts (``_parts``). The Redis implementations of the parts live beside
their in-memory ones: :mod:`guard.server.tenants`, :mod:`guard.server.directory` and
:mod:`guard.server.bus`.

Loaded only with ``--redis`` (``import guard.server`` does not import redis-py). The names
below resolve on first use, so that each part's Redis module, which imports the connection
from here, imports on its own.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "PendingUsage",
    "RecordBatch",
    "RedisTenantBudgets",
    "SharedTenantBudgets",
    "StateClient",
    "TenantStatus",
    "redis_parts",
]

_HOMES = {
    "PendingUsage": "guard.server.tenants._redis_pending",
    "RecordBatch": "guard.server.tenants._redis_budgets",
    "RedisTenantBudgets": "guard.server.tenants._redis_budgets",
    "TenantStatus": "guard.server.tenants._redis_budgets",
    "SharedTenantBudgets": "guard.server.tenants._redis",
    "StateClient": "guard.server._redis._client",
    "redis_parts": "guard.server._redis._parts",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
