"""Shared state of several guard replicas in Redis: tenant budgets, the run directory, the
directive bus.

Loaded only with ``--redis`` (``import guard.server`` does not import redis-py).
"""

from guard.server._redis._budgets import RecordBatch, RedisTenantBudgets, TenantStatus
from guard.server._redis._client import StateClient
from guard.server._redis._parts import redis_parts
from guard.server._redis._pending import PendingUsage
from guard.server._redis._shared import SharedTenantBudgets

__all__ = [
    "PendingUsage",
    "RecordBatch",
    "RedisTenantBudgets",
    "SharedTenantBudgets",
    "StateClient",
    "TenantStatus",
    "redis_parts",
]
