"""The tenant budget's window reads (``TenantBudget``: each limit's window and threshold
worked out once per policy, a window's total read without an update when nothing slid out,
the refused-need check skipped when nothing was refused) against the code they replaced, kept
here as the reference (the methods that changed, as they were, in subclasses): for any
sequence of admissions, ends, spend, reservations, allowance grants and policy reloads, at any
clock, both give the same decisions, the same figures and the same window state."""

from __future__ import annotations

import math
from typing import Any

from _hyp import examples
from hypothesis import example, given, settings
from hypothesis import strategies as st

from guard.errors import BudgetExceeded, InvalidInput
from guard.policy import (
    Decision,
    RollingLimit,
    RollingWindow,
    TenantAllowances,
    TenantBudget,
    TenantLimits,
    Usage,
)
from guard.policy._rolling import TenantReservation, nothing_to_grant
from guard.policy._window import WINDOW_CAP, _saturate


class ReferenceWindow(RollingWindow):
    """:class:`RollingWindow` with ``add`` and ``total`` as they were (the reference)."""

    __slots__ = ()

    def add(self, now: float, value: float) -> None:
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
        new = self._sums[slot] + value
        if -WINDOW_CAP <= new <= WINDOW_CAP and -WINDOW_CAP <= self._total + value <= WINDOW_CAP:
            self._sums[slot] = new
            self._total += value
        else:
            self._sums[slot] = _saturate(new)
            self._total = _saturate(math.fsum(self._sums))

    def total(self, now: float) -> float:
        self._advance(now)
        return self._total


class ReferenceBudget(TenantBudget):
    """:class:`TenantBudget` with its window reads as they were (the reference), on
    reference windows."""

    def __init__(self, tenant: str, limits: TenantLimits, *, buckets: int = 60) -> None:
        super().__init__(tenant, limits, buckets=buckets)
        self._windows = [ReferenceWindow(r.window_s, buckets=buckets) for r in limits.rolling]

    def _exhausted_locked(self, now: float) -> tuple[str, float, float] | None:
        for i, r in enumerate(self.limits.rolling):
            used = self._used(i, now)
            if used >= r.limit - 1e-9 * max(1.0, r.limit):
                return (r.metric, used, r.limit)
        return None

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

    def set_limits(self, limits: TenantLimits) -> None:
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
        self.led = TenantAllowances(self.tb)
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


@settings(max_examples=examples(400), deadline=None)
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


@settings(max_examples=examples(300), deadline=None)
@given(
    st.sampled_from([1.0, 7.0, 60.0]),
    st.sampled_from([1, 3, 60]),
    st.lists(
        st.tuples(st.one_of(st.integers(0, 200).map(float), st.floats(0, 500)), st.floats(-5, 5)),
        max_size=60,
    ),
)
def test_a_window_reads_and_adds_exactly_as_the_reference(window_s, buckets, steps):
    fast, ref = RollingWindow(window_s, buckets=buckets), ReferenceWindow(window_s, buckets=buckets)
    for now, value in steps:
        assert fast.total(now) == ref.total(now)
        fast.add(now, value)
        ref.add(now, value)
        assert _window_state(fast) == _window_state(ref)
