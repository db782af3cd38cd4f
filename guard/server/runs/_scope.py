"""What every part of one registry shares: the policy, the run table, the clock and the
counters (:class:`Scope`), and the base of the parts that unpacks it (:class:`RunPart`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from guard.policy import PolicyConfig
    from guard.server.runs._table import RunTable

__all__ = ["RunPart", "Scope"]


@dataclass(frozen=True, slots=True)
class Scope:
    """One registry's policy, run table, monotonic clock and counters (``stats``)."""

    config: PolicyConfig
    table: RunTable
    clock: Callable[[], float]
    stats: dict[str, int]


class RunPart:
    """A part of the registry (decisions, lifecycle, rejoin, admission): the scope unpacked,
    so the table's maps, the clock and the counters are one attribute away."""

    def __init__(self, scope: Scope) -> None:
        self.config = scope.config
        self.table = table = scope.table
        self.runs = table.runs
        self.ended = table.ended
        self.clock = scope.clock
        self.stats = scope.stats
