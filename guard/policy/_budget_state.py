"""The state and helpers :class:`~guard.policy.Budget` gives its mixins (type checking only).

``Escalations``, ``Reserving`` and ``Restorable`` hold no state: they read and write the
budget's slots. This class names what they use, and is their base class when a type
checker reads them (``if TYPE_CHECKING``); at run time their base is ``object``, so nothing
here is ever imported by the engine.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from guard.policy._budget import Budget
    from guard.policy._escalation import Triggers
    from guard.policy._reservation import Reservation
    from guard.policy._types import Limits, Usage

__all__ = ["BudgetState"]


class BudgetState:
    """What a :class:`~guard.policy.Budget` mixin may touch (the budget's slots). A plain
    class, not a Protocol: a protocol's bare attributes would read as new ones where a
    mixin assigns them. The methods are the budget's own (``_budget.py``)."""

    _clock: Callable[[], float]
    _limits: Limits
    _lock: threading.Lock
    _usage: Usage
    _usages: tuple[Usage, ...]
    _reserved: Usage
    _reservations: list[Reservation]
    _seq: int
    _trig: Triggers

    def _lineage(self) -> tuple[Budget, ...]:
        raise NotImplementedError

    def _elapsed_locked(self) -> float:
        raise NotImplementedError

    def _add_model_call_locked(
        self, input_tokens: int, output_tokens: int, reasoning: int, cached: int, cost: float | None
    ) -> None:
        raise NotImplementedError

    def record_tool_calls(
        self, n: int = 1, *, attempts: int | None = None, cost_usd: float | None = None
    ) -> int:
        raise NotImplementedError
