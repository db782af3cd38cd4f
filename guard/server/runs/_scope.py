"""What every part of one registry shares: the policy, the run table, the clock, the
counters and the shared-state parts (:class:`Scope`), and the base of the parts that unpacks
it (:class:`RunPart`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from guard.policy import PolicyConfig
    from guard.server.directory._interface import RunDirectory
    from guard.server.runs._table import RunTable
    from guard.server.tenants._interface import TenantBudgets

__all__ = ["RunPart", "Scope"]


@dataclass(frozen=True, slots=True)
class Scope:
    """One registry's policy, run table, monotonic clock and counters (``stats``), and the
    tenant budgets and run directory (in memory, or shared by replicas: no part here knows
    which)."""

    config: PolicyConfig
    table: RunTable
    clock: Callable[[], float]
    stats: dict[str, int]
    budgets: TenantBudgets
    directory: RunDirectory


class RunPart:
    """A part of the registry (decisions, lifecycle, rejoin, admission): the scope unpacked,
    so the table's maps, the clock, the counters and the shared-state parts are one attribute
    away."""

    def __init__(self, scope: Scope) -> None:
        self.config = scope.config
        self.table = table = scope.table
        self.runs = table.runs
        self.ended = table.ended
        self.clock = scope.clock
        self.stats = scope.stats
        self.budgets = scope.budgets
        self.directory = scope.directory
