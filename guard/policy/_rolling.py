"""The tenant budget: rolling limits over sliding windows (:mod:`._window`), the concurrency
cap, reservations, and the refusals every guard words the same way."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from guard.errors import InvalidInput
from guard.policy._types import CONTINUE, REASON_STATUS, Action, Decision, Reason, Usage
from guard.policy._window import RollingWindow

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
        f"run last needed (reserved by runs in flight {granted:g})",
    )


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
        self._plan = _plan(limits, self._windows)
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
        held = self._held
        for r, w, _j, reached in self._plan:
            used = w.total(now) + held.get(r.metric, 0.0)
            # Float sums of exact spends (25 x 0.02) land a hair below the limit: reached.
            if used >= reached:
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
        if not (self._refused[0] or self._refused[1]):
            return None  # nobody was refused: nothing to compare
        head = self._headroom_locked(now)
        for j, metric in enumerate(("cost_usd", "tokens")):
            h, need = head[j], self._refused[j]
            if h is None or not need:
                continue
            left = max(0.0, h - self._granted[j])
            if left + 1e-12 < need:  # within float drift: the two sums differ in order only
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
        held = self._held
        for r, w, j, _reached in self._plan:
            if j < 0:
                continue
            left = r.limit - (w.total(now) + held.get(r.metric, 0.0))
            if not left > 0.0:  # max(0.0, left), written out: this runs once per admission
                left = 0.0
            prev = out[j]
            out[j] = left if prev is None or left < prev else prev  # min(prev, left)
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
            self._plan = _plan(limits, self._windows)


def _plan(
    limits: TenantLimits, windows: list[RollingWindow]
) -> tuple[tuple[RollingLimit, RollingWindow, int, float], ...]:
    """Each rolling limit with its window, its allowance metric's index (0 cost_usd, 1 tokens,
    -1 none) and the use at which it counts as reached: what every admission reads, worked
    out once per policy."""
    return tuple(
        (
            r,
            w,
            0 if r.metric == "cost_usd" else 1 if r.metric == "tokens" else -1,
            r.limit - 1e-9 * max(1.0, r.limit),
        )
        for r, w in zip(limits.rolling, windows, strict=True)
    )
