"""Sliding windows for per-tenant budgets, and the tenant budget itself.

Semantics of :class:`RollingWindow` (exact, and what the property test checks):

* time is cut into buckets of width ``w = window_s / buckets``; an instant ``t`` belongs to
  bucket ``floor(t / w)``;
* ``total(now)`` is the sum of every value added at a time ``t`` whose bucket is one of the
  ``buckets`` most recent ones, i.e. ``floor(now/w) - floor(t/w) < buckets``. So the window
  covers between ``window_s - w`` and ``window_s`` seconds of history: it is the true sliding
  sum over ``(now - window_s, now]`` rounded to bucket granularity;
* time is monotonic: a ``now`` earlier than the latest seen is treated as the latest; a value
  added with an old ``t`` lands in its own bucket if that bucket is still in the window, and is
  dropped otherwise (it has already expired).

Memory is ``buckets`` floats and ints; ``add`` and ``total`` evict the buckets that slid out, at
most ``buckets`` of them, and each bucket is evicted once per window, so both are O(1)
amortised.
"""

from __future__ import annotations

import math
import threading
from array import array
from dataclasses import dataclass

from guard.errors import InvalidInput
from guard.policy._types import CONTINUE, REASON_STATUS, Action, Decision, Reason, Usage

__all__ = [
    "ROLLING_METRICS",
    "RollingLimit",
    "RollingWindow",
    "TenantBudget",
    "TenantLimits",
    "TenantReservation",
    "concurrency_reached",
    "nothing_to_grant",
    "tenant_stop",
    "window_reached",
]

ROLLING_METRICS = (
    "cost_usd",
    "tokens",
    "input_tokens",
    "output_tokens",
    "steps",
    "tool_calls",
    "runs",
)


WINDOW_CAP = 1e300  # a window's buckets and total saturate here, never reach inf


def _saturate(x: float) -> float:
    return x if -WINDOW_CAP <= x <= WINDOW_CAP else math.copysign(WINDOW_CAP, x)


def tenant_stop(metric: str, utilisation: float | None, message: str) -> Decision:
    """STOP / tenant_budget with ``message``: every tenant-budget refusal is one of these."""
    reason = Reason.TENANT_BUDGET
    return Decision(Action.STOP, REASON_STATUS[reason], reason, utilisation, metric, message)


def window_reached(
    tenant: str, metric: str, used: float, limit: float, window_s: float | None
) -> Decision:
    """A rolling window of ``tenant`` is reached (the message every guard gives for it)."""
    span = f" per {window_s:g}s" if window_s is not None else ""
    return tenant_stop(
        metric,
        used / limit if limit else None,
        f"tenant {tenant}: {metric} {used:g} reached its limit {limit:g}{span}",
    )


def concurrency_reached(tenant: str, live_runs: int, cap: int) -> Decision:
    """``tenant`` has ``max_concurrent_runs`` live runs already."""
    return tenant_stop(
        "concurrent_runs",
        live_runs / cap if cap else None,
        f"tenant {tenant}: max_concurrent_runs {cap} reached (live_runs={live_runs})",
    )


def nothing_to_grant(
    tenant: str, metric: str, left: float, need: float, granted: float
) -> Decision:
    """Less of ``metric`` is left to grant than a run of ``tenant`` last needed."""
    return tenant_stop(
        metric,
        None,
        f"tenant {tenant}: {metric} has {left:g} left to grant, less than the {need:g} a "
        f"run last needed (granted to live runs {granted:g})",
    )


class RollingWindow:
    """A bucketed sliding-window sum (see the module docstring for the exact semantics)."""

    __slots__ = ("_head", "_ids", "_sums", "_total", "buckets", "width_s", "window_s")

    def __init__(self, window_s: float, *, buckets: int = 60) -> None:
        if not (isinstance(window_s, int | float) and math.isfinite(window_s) and window_s > 0):
            raise InvalidInput(f"window_s must be a finite number > 0, got {window_s!r}")
        if not isinstance(buckets, int) or buckets < 1:
            raise InvalidInput(f"buckets must be an int >= 1, got {buckets!r}")
        self.window_s = float(window_s)
        self.buckets = buckets
        self.width_s = self.window_s / buckets
        self._sums = array("d", bytes(8 * buckets))
        self._ids = array("q", [-(2**62)] * buckets)  # bucket id held by each slot
        self._head: int | None = None  # newest bucket id seen
        self._total = 0.0

    def _bucket(self, t: float) -> int:
        return math.floor(t / self.width_s)

    def _advance(self, now: float) -> int:
        b = self._bucket(now)
        if self._head is None:
            self._head = b
            return b
        if b <= self._head:
            return self._head
        oldest_live = b - self.buckets + 1
        if b - self._head >= self.buckets:
            for i in range(self.buckets):
                self._sums[i] = 0.0
            self._total = 0.0
        else:
            for k in range(self._head + 1, b + 1):
                slot = k % self.buckets
                if self._ids[slot] < oldest_live:
                    self._total -= self._sums[slot]
                    self._sums[slot] = 0.0
        self._head = b
        if abs(self._total) < 1e-9:
            # Float subtraction drift: when every bucket is empty the sum is exactly zero.
            self._total = math.fsum(self._sums)
        return b

    def add(self, now: float, value: float) -> None:
        """Add ``value`` at time ``now`` (values may be negative, e.g. to undo a charge)."""
        if not math.isfinite(value):
            raise InvalidInput(f"rolling window value must be finite, got {value!r}")
        head = self._advance(now)
        b = min(self._bucket(now), head)
        if head - b >= self.buckets:
            return  # already outside the window
        slot = b % self.buckets
        if self._ids[slot] != b:
            self._total -= self._sums[slot]
            self._sums[slot] = 0.0
            self._ids[slot] = b
        # A sum of finite values can still overflow to inf (which would stop a tenant
        # forever and poison every later sum): bucket and total saturate at WINDOW_CAP, far
        # above any limit, so the window still reads "over its limit" and stays finite.
        new = self._sums[slot] + value
        if -WINDOW_CAP <= new <= WINDOW_CAP and -WINDOW_CAP <= self._total + value <= WINDOW_CAP:
            self._sums[slot] = new
            self._total += value
        else:
            self._sums[slot] = _saturate(new)
            self._total = _saturate(math.fsum(self._sums))

    def total(self, now: float) -> float:
        """Sum of the values in the window ending at ``now``."""
        self._advance(now)
        return self._total


@dataclass(frozen=True, slots=True)
class RollingLimit:
    """``limit`` of ``metric`` per sliding ``window_s`` seconds."""

    metric: str
    limit: float
    window_s: float


@dataclass(frozen=True, slots=True)
class TenantLimits:
    max_concurrent_runs: int | None = None
    rolling: tuple[RollingLimit, ...] = ()


def _metric_value(metric: str, delta: Usage) -> float:
    if metric == "cost_usd":
        return delta.cost_usd or 0.0
    if metric == "tokens":
        return float(delta.tokens)
    if metric == "runs":
        return 0.0  # counted by admit()
    return float(getattr(delta, metric))


class TenantReservation:
    """An estimate held against a tenant's windows until settled or released."""

    __slots__ = ("_owner", "cost_usd", "done", "tokens")

    def __init__(self, owner: TenantBudget, cost_usd: float, tokens: int) -> None:
        self._owner, self.cost_usd, self.tokens, self.done = owner, cost_usd, tokens, False

    def settle(self, now: float, actual: Usage | None = None) -> Decision:
        """Free the estimate and record ``actual`` (if given) into the windows."""
        self._owner._unreserve(self)
        return self._owner.record(now, actual) if actual is not None else CONTINUE

    def release(self) -> None:
        self._owner._unreserve(self)

    def __enter__(self) -> TenantReservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class TenantBudget:
    """A tenant's rolling budgets and concurrent-runs cap. Thread-safe.

    Exhausting any window stops the tenant's live runs (``record`` returns STOP) and denies new
    ones (``admit`` returns STOP) until enough of the window has slid past.
    """

    def __init__(self, tenant: str, limits: TenantLimits, *, buckets: int = 60) -> None:
        self.tenant = tenant
        self.limits = limits
        self.live_runs = 0
        self._buckets = buckets
        self._lock = threading.Lock()
        self._windows = [RollingWindow(r.window_s, buckets=buckets) for r in limits.rolling]
        self._held = {"cost_usd": 0.0, "tokens": 0.0}
        # Outstanding allowance grants (cost_usd, tokens), kept by TenantAllowances under this
        # budget's lock: a reservation must not take what is already granted to a run.
        self._granted = [0.0, 0.0]
        # The need the allowances last refused (cost_usd, tokens): while what is left to grant
        # stays below it, a new run would be refused the same way, so it is denied instead.
        self._refused = [0.0, 0.0]

    def _used(self, i: int, now: float) -> float:
        r = self.limits.rolling[i]
        return self._windows[i].total(now) + self._held.get(r.metric, 0.0)

    def _exhausted_locked(self, now: float) -> tuple[str, float, float] | None:
        for i, r in enumerate(self.limits.rolling):
            used = self._used(i, now)
            # Float sums of exact spends (25 x 0.02) land a hair below the limit: reached.
            if used >= r.limit - 1e-9 * max(1.0, r.limit):
                return (r.metric, used, r.limit)
        return None

    def _window_of(self, metric: str) -> float | None:
        for r in self.limits.rolling:
            if r.metric == metric:
                return r.window_s
        return None

    def admit(self, now: float) -> Decision:
        """Admit a new run (counts it) or deny it with STOP/TENANT_BUDGET."""
        with self._lock:
            cap = self.limits.max_concurrent_runs
            if cap is not None and self.live_runs >= cap:
                return concurrency_reached(self.tenant, self.live_runs, cap)
            hit = self._exhausted_locked(now)
            if hit is not None:
                return window_reached(self.tenant, *hit, self._window_of(hit[0]))
            short = self._nothing_to_grant_locked(now)
            if short is not None:
                return short
            for i, r in enumerate(self.limits.rolling):
                if r.metric == "runs":
                    self._windows[i].add(now, 1.0)
            self.live_runs += 1
            return CONTINUE

    def _nothing_to_grant_locked(self, now: float) -> Decision | None:
        head = self._headroom_locked(now)
        for j, metric in enumerate(("cost_usd", "tokens")):
            h, need = head[j], self._refused[j]
            if h is None or not need:
                continue
            left = max(0.0, h - self._granted[j])
            if left < need:
                return nothing_to_grant(self.tenant, metric, left, need, self._granted[j])
        return None

    def run_ended(self) -> None:
        with self._lock:
            self.live_runs = max(0, self.live_runs - 1)

    def record(self, now: float, delta: Usage) -> Decision:
        """Add a run's new spend; STOP/TENANT_BUDGET once any window is reached."""
        with self._lock:
            for i, r in enumerate(self.limits.rolling):
                v = _metric_value(r.metric, delta)
                if v:
                    self._windows[i].add(now, v)
            hit = self._exhausted_locked(now)
        if hit is not None:
            return window_reached(self.tenant, *hit, self._window_of(hit[0]))
        return CONTINUE

    def reserve(self, now: float, *, cost_usd: float = 0.0, tokens: int = 0) -> TenantReservation:
        """Hold an estimate so parallel calls of one tenant cannot oversell a window.

        Raises :class:`guard.errors.BudgetExceeded` when the estimate does not fit.
        """
        from guard.errors import BudgetExceeded

        if cost_usd < 0 or tokens < 0 or not math.isfinite(cost_usd):
            raise InvalidInput(f"reservation must be >= 0 (cost_usd={cost_usd}, tokens={tokens})")
        with self._lock:
            for i, r in enumerate(self.limits.rolling):
                want = cost_usd if r.metric == "cost_usd" else tokens if r.metric == "tokens" else 0
                if not want:
                    continue
                used = self._used(i, now)
                granted = self._granted[0 if r.metric == "cost_usd" else 1]
                available = max(0.0, r.limit - used - granted)
                if want > available + 1e-12:
                    raise BudgetExceeded(
                        f"tenant {self.tenant}: reserving {r.metric}={want:g} would oversell "
                        f"the {r.window_s:g}s window (limit {r.limit:g}, used {used:g})",
                        metric=r.metric,
                        requested=float(want),
                        available=available,
                    )
            self._held["cost_usd"] += cost_usd
            self._held["tokens"] += tokens
            return TenantReservation(self, cost_usd, tokens)

    def _unreserve(self, res: TenantReservation) -> None:
        with self._lock:
            if res.done:
                return
            res.done = True
            self._held["cost_usd"] -= res.cost_usd
            self._held["tokens"] -= res.tokens

    def headroom(self, now: float) -> tuple[float | None, float | None]:
        """What the ``cost_usd`` and ``tokens`` windows have left (the tightest window of each,
        net of held reservations, floored at 0); ``None`` = no window of that metric."""
        with self._lock:
            return self._headroom_locked(now)

    def _headroom_locked(self, now: float) -> tuple[float | None, float | None]:
        out: list[float | None] = [None, None]
        for i, r in enumerate(self.limits.rolling):
            j = 0 if r.metric == "cost_usd" else 1 if r.metric == "tokens" else -1
            if j < 0:
                continue
            left = max(0.0, r.limit - self._used(i, now))
            prev = out[j]
            out[j] = left if prev is None else min(prev, left)
        return (out[0], out[1])

    def status(self, now: float) -> list[tuple[str, float, float, float]]:
        """``(metric, window_s, used, limit)`` for every rolling limit."""
        with self._lock:
            return [
                (r.metric, r.window_s, self._used(i, now), r.limit)
                for i, r in enumerate(self.limits.rolling)
            ]

    def exhausted(self, now: float) -> tuple[str, float, float] | None:
        """``(metric, used, limit)`` of the first exhausted window, else ``None``."""
        with self._lock:
            return self._exhausted_locked(now)

    def set_limits(self, limits: TenantLimits) -> None:
        """Replace the limits (policy reload); windows of unchanged limits keep their data."""
        with self._lock:
            old = dict(zip(self.limits.rolling, self._windows, strict=True))
            self.limits = limits
            self._windows = [
                old.get(r) or RollingWindow(r.window_s, buckets=self._buckets)
                for r in limits.rolling
            ]
