"""Forecast the step at which a run's token or cost budget runs out.

Every round resends the history, so step ``n`` costs about ``B + (n-1)·D`` input tokens and
the run about ``n·B + D·n(n-1)/2`` in total, quadratic in its length. The forecaster fits ``B``
and ``D`` by ordinary least squares over the observed steps with five running sums (O(1)
memory and time), then finds the first step whose cumulative predicted spend reaches the
limit, so a warning can come several steps before the wall.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from guard.errors import InvalidInput
from guard.policy._types import Limits, Usage

__all__ = ["Forecast", "Forecaster"]

_HORIZON = 1_000_000  # steps; beyond this a budget is as good as unlimited


@dataclass(frozen=True, slots=True)
class Forecast:
    """``base_tokens`` (B) and ``delta_tokens`` (D) of the fit; ``exhaust_step`` is the 1-based
    step index during which the first budget (``metric``: ``tokens`` or ``cost_usd``) is
    predicted to run out, ``None`` if no set budget runs out within the horizon."""

    base_tokens: float
    delta_tokens: float
    exhaust_step: int | None
    metric: str | None


class Forecaster:
    """Running least-squares fit of per-step input tokens (``x = step_index - 1``)."""

    __slots__ = ("_last", "_n", "_sx", "_sxx", "_sxy", "_sy")

    def __init__(self) -> None:
        self._n = 0
        self._sx = self._sy = self._sxx = self._sxy = 0.0
        self._last = 0

    def observe(self, step_index: int, input_tokens: int) -> None:
        """Add one step's input tokens (``step_index`` is 1-based)."""
        # ``type(x) is not int`` first: plain ints (the hot path) skip the isinstance checks
        bad_type = type(step_index) is not int and (
            isinstance(step_index, bool) or not isinstance(step_index, int)
        )
        if bad_type or step_index < 1:
            raise InvalidInput(f"step_index must be an int >= 1, got {step_index!r}")
        bad_type = type(input_tokens) is not int and (
            isinstance(input_tokens, bool) or not isinstance(input_tokens, int)
        )
        if bad_type or input_tokens < 0:
            raise InvalidInput(f"input_tokens must be an int >= 0, got {input_tokens!r}")
        x = float(step_index - 1)
        self._n += 1
        self._sx += x
        self._sy += input_tokens
        self._sxx += x * x
        self._sxy += x * input_tokens
        self._last = max(self._last, step_index)

    def fit(self) -> tuple[float, float]:
        """``(B, D)``; with one point D is 0, with none both are 0."""
        n = self._n
        if n == 0:
            return 0.0, 0.0
        den = n * self._sxx - self._sx * self._sx
        d = (n * self._sxy - self._sx * self._sy) / den if n >= 2 and den > 1e-12 else 0.0
        b = (self._sy - d * self._sx) / n
        return b, d

    def forecast(
        self, limits: Limits, usage: Usage, *, usd_per_input_token: float | None = None
    ) -> Forecast:
        """Predict when ``limits.max_tokens`` or ``limits.max_cost_usd`` runs out.

        Per future step the spend is the fitted input ``B + (j-1)·D`` plus the run's average
        output per step so far. Cost uses ``usd_per_input_token`` when given, else the run's own
        average cost per token so far (``None`` cost = unpriced = no cost forecast).
        """
        b, d = self.fit()
        done = max(self._last, usage.steps)
        out_per_step = usage.output_tokens / done if done else 0.0
        found: list[tuple[int, str]] = []
        if limits.max_tokens is not None:
            k = self._exhaust(done, usage.tokens, limits.max_tokens, b, d, out_per_step, 1.0)
            if k is not None:
                found.append((k, "tokens"))
        if limits.max_cost_usd is not None:
            price = usd_per_input_token
            if price is None and usage.cost_usd is not None and usage.tokens > 0:
                price = usage.cost_usd / usage.tokens
            if price is not None and price > 0:
                # Spent so far: the actual cost when priced, else the tokens at this price.
                used = usage.cost_usd if usage.cost_usd is not None else usage.tokens * price
                k = self._exhaust(done, used, limits.max_cost_usd, b, d, out_per_step, price)
                if k is not None:
                    found.append((k, "cost_usd"))
        if not found:
            return Forecast(b, d, None, None)
        k, metric = min(found)
        return Forecast(b, d, k, metric)

    @staticmethod
    def _exhaust(
        done: int, used: float, limit: float, b: float, d: float, out: float, price: float
    ) -> int | None:
        """First step ``k > done`` whose cumulative predicted spend reaches ``limit``."""
        if used >= limit:
            return max(done, 1)
        # A shrinking context (negative D) is forecast as flat: conservative, and it keeps the
        # cumulative spend monotone so the bisection below is exact.
        d = max(d, 0.0)

        def spend(k: int) -> float:  # predicted spend of steps done+1..k
            steps = k - done
            xs = (k - 1) * k / 2 - (done - 1) * done / 2  # sum of (j-1) for j in done+1..k
            return price * (steps * (b + out) + d * xs)

        lo, hi = done + 1, done + _HORIZON
        if used + spend(hi) < limit or not math.isfinite(spend(hi)):
            return None
        while lo < hi:
            mid = (lo + hi) // 2
            if used + spend(mid) >= limit:
                hi = mid
            else:
                lo = mid + 1
        return lo
