"""The tenant budget's window reads (``TenantBudget``: each limit's window and threshold
worked out once per policy, a window's total read without an update when nothing slid out,
the refused-need check skipped when nothing was refused) against the code they replaced, kept
here verbatim as the reference: for any sequence of admissions, ends, spend, reservations,
allowance grants and policy reloads, at any clock, both give the same decisions, the same
figures and the same window state."""

from __future__ import annotations

import math
import threading
from array import array
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from guard.errors import BudgetExceeded, InvalidInput
from guard.policy import (
    CONTINUE,
    Decision,
    RollingLimit,
    TenantAllowances,
    TenantBudget,
    TenantLimits,
    Usage,
)
from guard.policy._rolling import (
    TenantReservation,
    _metric_value,
    concurrency_reached,
    nothing_to_grant,
    window_reached,
)
from guard.policy._window import WINDOW_CAP, _saturate


class ReferenceWindow:
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


class ReferenceBudget:
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
        self._windows = [ReferenceWindow(r.window_s, buckets=buckets) for r in limits.rolling]
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

    def reserve(self, now: float, *, cost_usd: float = 0.0, tokens: int = 0) -> Any:
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
                old.get(r) or ReferenceWindow(r.window_s, buckets=self._buckets)
                for r in limits.rolling
            ]


_LIMITS = [
    TenantLimits(
        max_concurrent_runs=3,
        rolling=(
            RollingLimit("cost_usd", 1.0, 60.0),
            RollingLimit("tokens", 1000.0, 10.0),
            RollingLimit("runs", 5.0, 30.0),
        ),
    ),
    TenantLimits(
        rolling=(
            RollingLimit("cost_usd", 0.5, 5.0),
            RollingLimit("cost_usd", 2.0, 3600.0),
            RollingLimit("steps", 20.0, 7.0),
            RollingLimit("tokens", 800.0, 30.0),
        ),
    ),
    TenantLimits(
        rolling=(
            RollingLimit("tokens", 5000.0, 60.0),
            RollingLimit("tokens", 600.0, 4.0),
            RollingLimit("cost_usd", 1.0, 20.0),
        ),
    ),
    TenantLimits(max_concurrent_runs=1),
    TenantLimits(rolling=(RollingLimit("tokens", 300.0, 3.0), RollingLimit("runs", 2.0, 9.0))),
]
_OPS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                *("admit", "admit", "end", "record", "reserve", "settle", "grant", "release"),
                *("headroom", "status", "exhausted", "reload", "tick"),
            ]
        ),
        st.one_of(st.integers(0, 120).map(float), st.floats(0.0, 400.0)),  # now: any order
        st.sampled_from([0.0, 0.1, 0.2, 0.3, 1 / 3, 0.05, 0.7, 1.0, 2.5]),  # an amount
        st.integers(0, 7),
    ),
    max_size=80,
)


def _answer(fn: Any) -> Any:
    try:
        out = fn()
    except (InvalidInput, BudgetExceeded) as exc:
        return ("raised", type(exc).__name__, str(exc))
    if hasattr(out, "action"):  # a Decision
        return (out.action, out.reason, out.utilisation, out.metric, out.message)
    return out


def _window_state(w: Any) -> Any:
    return (list(w._sums), list(w._ids), w._head, w._total)


def _state(tb: Any) -> Any:
    return (
        [_window_state(w) for w in tb._windows],
        tb.live_runs,
        dict(tb._held),
        tuple(tb._granted),
        tuple(tb._refused),
        tb.limits,
    )


class _Side:
    """One budget with its allowances and the reservations it holds."""

    def __init__(self, cls: type, limits: TenantLimits) -> None:
        self.tb = cls("acme", limits)
        self.led = TenantAllowances(self.tb, fraction=0.2)
        self.held: list[Any] = []

    def apply(self, op: tuple) -> Any:
        name, now, amount, k = op
        tb = self.tb
        if name == "admit":
            return _answer(lambda: tb.admit(now))
        if name == "end":
            return _answer(tb.run_ended)
        if name == "record":
            usage = Usage(steps=k, input_tokens=int(amount * 400), cost_usd=amount / (k + 1))
            return _answer(lambda: tb.record(now, usage))
        if name == "reserve":
            got = _answer(lambda: tb.reserve(now, cost_usd=amount / 2, tokens=k * 40))
            if isinstance(got, TenantReservation):
                self.held.append(got)
                return "held"
            return got
        if name == "settle":
            if not self.held:
                return None
            res = self.held.pop(k % len(self.held))
            return _answer(lambda: res.settle(now, Usage(cost_usd=res.cost_usd / 2)))
        if name == "grant":
            need = {"need_cost_usd": amount} if k % 2 else {"need_tokens": amount * 400}
            return _answer(lambda: tuple(self.led.grant(f"r{k}", now, **need)))
        if name == "release":
            return _answer(lambda: self.led.release(f"r{k}", now, final=(amount, 0.0)))
        if name == "headroom":
            return _answer(lambda: tb.headroom(now))
        if name == "status":
            return _answer(lambda: tb.status(now))
        if name == "exhausted":
            return _answer(lambda: tb.exhausted(now))
        if name == "reload":
            tb.set_limits(_LIMITS[k % len(_LIMITS)])
            return None
        return _answer(lambda: tb.headroom(now + amount * 100))  # "tick": a later read


@settings(max_examples=400, deadline=None)
@example(0, [("admit", 0.0, 0.0, 0)] * 4 + [("end", 1.0, 0.0, 0), ("admit", 1.0, 0.0, 0)])
@example(0, [("grant", 0.0, 0.7, 1), ("grant", 0.0, 0.7, 3), ("admit", 0.0, 0.0, 0)])
@example(0, [("grant", 0.0, 2.0, 0), ("grant", 0.0, 2.0, 2), ("admit", 0.0, 0.0, 0)])
# ten spends of 0.1 sum to a hair below 1.0: the window counts as reached
@example(0, [("record", 1.0, 0.1, 0)] * 10 + [("admit", 1.0, 0.0, 0), ("exhausted", 1.0, 0, 0)])
@given(st.integers(0, len(_LIMITS) - 1), _OPS)
def test_the_tenant_budget_equals_the_reference_for_any_sequence(shape, ops):
    fast, ref = _Side(TenantBudget, _LIMITS[shape]), _Side(ReferenceBudget, _LIMITS[shape])
    for op in ops:
        got, want = fast.apply(op), ref.apply(op)
        assert got == want, (op, got, want)
        assert _state(fast.tb) == _state(ref.tb), op


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([1.0, 7.0, 60.0]),
    st.sampled_from([1, 3, 60]),
    st.lists(
        st.tuples(st.one_of(st.integers(0, 200).map(float), st.floats(0, 500)), st.floats(-5, 5)),
        max_size=60,
    ),
)
def test_a_window_reads_and_adds_exactly_as_the_reference(window_s, buckets, steps):
    from guard.policy import RollingWindow

    fast, ref = RollingWindow(window_s, buckets=buckets), ReferenceWindow(window_s, buckets=buckets)
    for now, value in steps:
        assert fast.total(now) == ref.total(now)
        fast.add(now, value)
        ref.add(now, value)
        assert _window_state(fast) == _window_state(ref)
