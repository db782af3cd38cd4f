"""Reservations: an estimate held against a budget (and its ancestors) until settled or
released, and the budget's side of them (:class:`Reserving`, a mixin of the Budget)."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from guard.errors import BudgetExceeded, InvalidInput
from guard.policy._types import Usage

if TYPE_CHECKING:  # pragma: no cover
    from guard.policy._budget_state import BudgetState as _Host
else:
    _Host = object  # the mixin's base at run time

__all__ = ["Reservation", "Reserving", "check_count", "check_model_call", "check_money"]


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


def check_model_call(
    input_tokens: Any, output_tokens: Any, reasoning_tokens: Any, cached_tokens: Any, cost_usd: Any
) -> float | None:
    """The full check of a model call's usage, for what fails the hot paths' one-look tests
    (:func:`plain_counts`, :func:`plain_money`): raises on the first bad value, in argument
    order, and returns the cost as a float (``None``: unpriced)."""
    check_count("input_tokens", input_tokens)
    check_count("output_tokens", output_tokens)
    check_count("reasoning_tokens", reasoning_tokens)
    check_count("cached_tokens", cached_tokens)
    return None if cost_usd is None else check_money("cost_usd", cost_usd)


@dataclass(slots=True, eq=False)  # compared by identity: a budget's list removes this one
class Reservation:
    """An estimate held against a budget (and its ancestors) until settled or released.

    Use as a context manager: leaving the block releases the estimate unless ``settle`` ran.
    """

    _budget: Reserving
    tokens: int
    cost_usd: float
    tool_calls: int
    expires_at: float | None
    done: bool = field(default=False, init=False)

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
    def owner(self) -> Reserving:
        """The budget the reservation was made on."""
        return self._budget

    def release(self) -> None:
        """Free the estimate without recording anything (idempotent)."""
        self._budget._finish(self, None)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Reserving(_Host):
    """Mixin of :class:`~guard.policy.Budget` (it owns the state; this holds no slots).

    A reservation is checked against, held by and listed on every budget of the lineage, so
    a parent's :meth:`release_expired` also sweeps what an abandoned nested run left behind.
    """

    __slots__ = ()

    def reserve(
        self,
        *,
        tokens: int = 0,
        cost_usd: float = 0.0,
        tool_calls: int = 0,
        ttl_s: float | None = None,
    ) -> Reservation:
        """Hold an estimate atomically against this budget and every ancestor.

        Raises :class:`BudgetExceeded` (with the metric, the request and what is available)
        when used + reserved + request would pass a hard limit anywhere in the chain.
        """
        tokens = check_count("tokens", tokens)
        cost = check_money("cost_usd", cost_usd)
        tool_calls = check_count("tool_calls", tool_calls)
        if ttl_s is not None and (not math.isfinite(ttl_s) or ttl_s <= 0):
            raise InvalidInput(f"ttl_s must be a finite number > 0, got {ttl_s!r}")
        with self._lock:
            now = self._clock()
            lineage = self._lineage()
            for b in lineage:
                b._release_expired_locked(now)
            for b in lineage:
                b._check_locked(tokens, cost, tool_calls)
            res = Reservation(
                self, tokens, cost, tool_calls, None if ttl_s is None else now + ttl_s
            )
            delta = Usage(input_tokens=tokens, tool_calls=tool_calls, cost_usd=cost)
            for b in lineage:
                b._reserved.add(delta)
                b._reservations.append(res)
            return res

    def held(self) -> tuple[float, int]:
        """``(cost_usd, tokens)`` used + reserved, sub-runs included (what a tenant allowance
        must cover)."""
        with self._lock:
            u, r = self._usage, self._reserved
            return ((u.cost_usd or 0.0) + (r.cost_usd or 0.0), u.tokens + r.tokens)

    def _check_locked(self, tokens: int, cost: float, tool_calls: int) -> None:
        lim, u, r = self._limits, self._usage, self._reserved
        checks: tuple[tuple[str, float, float | None, float], ...] = (
            ("tokens", tokens, lim.max_tokens, u.tokens + r.tokens),
            ("cost_usd", cost, lim.max_cost_usd, (u.cost_usd or 0.0) + (r.cost_usd or 0.0)),
            ("tool_calls", tool_calls, lim.max_tool_calls, u.tool_calls + r.tool_calls),
        )
        for metric, want, limit, held in checks:
            if limit is None or not want:
                continue
            available = max(0.0, limit - held)
            # A tiny epsilon so float cost sums that equal the limit are not refused.
            if want > available + 1e-12:
                raise BudgetExceeded(
                    f"reserving {metric}={want:g} would oversell the budget: "
                    f"limit {limit:g}, used+reserved {held:g}, available {available:g}",
                    metric=metric,
                    requested=float(want),
                    available=float(available),
                )

    def _finish(self, res: Reservation, actual: Usage | None) -> None:
        with self._lock:
            if res.done:
                return
            res.done = True
            self._drop_locked(res)
            if actual is not None:
                for u in self._usages:
                    u.add(actual)

    def _drop_locked(self, res: Reservation) -> None:
        neg = Usage(input_tokens=-res.tokens, tool_calls=-res.tool_calls, cost_usd=-res.cost_usd)
        for b in self._lineage():
            b._reserved.add(neg)
            if b._reserved.cost_usd is not None and abs(b._reserved.cost_usd) < 1e-12:
                b._reserved.cost_usd = 0.0
            with contextlib.suppress(ValueError):
                b._reservations.remove(res)

    def _release_expired_locked(self, now: float) -> int:
        expired = [
            r for r in self._reservations if r.expires_at is not None and r.expires_at <= now
        ]
        for r in expired:
            r.done = True
            r.owner._drop_locked(r)
        return len(expired)

    def release_expired(self) -> int:
        """Drop reservations past their ttl (never settled), nested runs' included; returns
        how many."""
        with self._lock:
            return self._release_expired_locked(self._clock())

    @property
    def outstanding(self) -> int:
        """Unsettled reservations held against this budget (its own and its nested runs')."""
        with self._lock:
            return len(self._reservations)
