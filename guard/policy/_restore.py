"""Record numbers, snapshots and restores of a budget: what a re-registration needs.

The SDK numbers every counted record of a run (``Budget.seq``, under the budget's lock) and
puts the number on the span (``guard.seq``). A re-registration after a reconnect carries the
run's ``(usage, seq)`` snapshot; a restarted guard *sets* the run's counters from it and skips
the spans numbered ``<= seq``, which the snapshot already holds (the exporter may retry them).
Mixin of :class:`~guard.policy.Budget` (it owns the state; this holds no slots).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from guard.policy._budget import Budget
    from guard.policy._budget_state import BudgetState as _Host
    from guard.policy._types import Usage
else:
    _Host = object  # the mixin's base at run time

__all__ = ["Restorable"]


class Restorable(_Host):
    """Mixin of :class:`~guard.policy.Budget`."""

    __slots__ = ()

    @property
    def seq(self) -> int:
        """How many counted records (steps, model calls, tool-call records) this budget took."""
        return self._seq

    def snapshot(self) -> tuple[Usage, int]:
        """``(usage, seq)`` read together: every record numbered ``<= seq`` is in ``usage``."""
        with self._lock:
            return self._usage.copy(), self._seq

    @staticmethod
    def snapshot_all(budgets: list[Budget]) -> list[tuple[Usage, int]]:
        """:meth:`snapshot` of several budgets, each nested run tree read at one instant
        (under its shared lock), so a parent's usage holds exactly its children's snapshots.
        """
        out: list[tuple[Usage, int] | None] = [None] * len(budgets)
        trees: dict[int, list[int]] = {}
        for i, b in enumerate(budgets):
            trees.setdefault(id(b._lock), []).append(i)
        for idx in trees.values():
            with budgets[idx[0]]._lock:
                for i in idx:
                    b = budgets[i]
                    out[i] = (b._usage.copy(), b._seq)
        return out  # type: ignore[return-value]

    def restore(self, usage: Usage, seq: int = 0) -> None:
        """Set this budget's own counters (not its ancestors'): a re-registered run's usage.

        Setting, never adding through the parent chain: a parent's snapshot already holds
        what its nested runs had spent when it was taken.
        """
        with self._lock:
            self._usage.assign(usage)  # in place: the nested runs' lineages hold this object
            self._seq = max(self._seq, seq)
