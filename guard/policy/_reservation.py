"""Reservations: an estimate held against a budget until settled or released."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from guard.errors import InvalidInput
from guard.policy._types import Usage

if TYPE_CHECKING:  # pragma: no cover
    from guard.policy._budget import Budget

__all__ = ["Reservation", "check_count", "check_money"]


def check_count(name: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise InvalidInput(f"{name} must be an int >= 0, got {v!r}")
    return v


def plain_counts(a: Any, b: Any, c: Any, d: Any) -> bool:
    """Four exact non-negative ints: the hot paths' one-look test (anything else gets
    :func:`check_count` and its error message)."""
    return (
        type(a) is int
        and type(b) is int
        and type(c) is int
        and type(d) is int
        and a >= 0
        and b >= 0
        and c >= 0
        and d >= 0
    )


def plain_money(v: Any) -> bool:
    """An exact finite float >= 0 (else :func:`check_money` decides)."""
    return type(v) is float and 0.0 <= v < math.inf


def check_money(name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise InvalidInput(f"{name} must be a finite number >= 0, got {v!r}")
    return float(v)


class Reservation:
    """An estimate held against a budget (and its ancestors) until settled or released.

    Use as a context manager: leaving the block releases the estimate unless ``settle`` ran.
    """

    __slots__ = ("_budget", "cost_usd", "done", "expires_at", "tokens", "tool_calls")

    def __init__(
        self,
        budget: Budget,
        tokens: int,
        cost_usd: float,
        tool_calls: int,
        expires_at: float | None,
    ) -> None:
        self._budget = budget
        self.tokens = tokens
        self.cost_usd = cost_usd
        self.tool_calls = tool_calls
        self.expires_at = expires_at
        self.done = False

    def settle(
        self,
        *,
        tokens: int | None = None,
        cost_usd: float | None = None,
        tool_calls: int | None = None,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
    ) -> None:
        """Free the estimate and record the actual amounts given (``None`` = record nothing).

        ``tokens`` is recorded as input tokens; pass ``input_tokens``/``output_tokens`` to
        split. Callers that already recorded the usage (``record_model_call``) call
        ``settle()`` with no arguments. Settling twice, or after a release, is a no-op.
        """
        usage = Usage(
            input_tokens=check_count("input_tokens", (tokens or 0) + (input_tokens or 0)),
            output_tokens=check_count("output_tokens", output_tokens or 0),
            tool_calls=check_count("tool_calls", tool_calls or 0),
            tool_attempts=tool_calls or 0,
            cost_usd=None if cost_usd is None else check_money("cost_usd", cost_usd),
        )
        self._budget._finish(self, usage)

    @property
    def owner(self) -> Budget:
        """The budget the reservation was made on."""
        return self._budget

    def release(self) -> None:
        """Free the estimate without recording anything (idempotent)."""
        self._budget._finish(self, None)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
