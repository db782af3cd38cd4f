"""Rolling windows and tenant budgets."""

from __future__ import annotations

import contextlib
import math
import sys
import threading

import pytest
from _hyp import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from guard.errors import BudgetExceeded, InvalidInput
from guard.policy import (
    Action,
    Reason,
    RollingLimit,
    RollingWindow,
    Status,
    TenantBudget,
    TenantLimits,
    Usage,
)


def brute_force(events: list[tuple[float, float]], now: float, window_s: float, buckets: int):
    """The documented semantics: an event at t counts at `now` iff
    floor(now/w) - floor(t/w) < buckets, with w = window_s / buckets (and t <= now)."""
    w = window_s / buckets
    b_now = math.floor(now / w)
    return math.fsum(v for t, v in events if t <= now and b_now - math.floor(t / w) < buckets)


@settings(max_examples=examples(300), deadline=None)
@given(
    window_s=st.sampled_from([1.0, 10.0, 60.0, 3600.0, 7.5]),
    buckets=st.integers(min_value=1, max_value=64),
    steps=st.lists(
        st.tuples(
            st.floats(min_value=0.0, max_value=50.0),  # time step, as a fraction of window/10
            st.floats(min_value=-1e3, max_value=1e6, allow_nan=False),
            st.booleans(),  # query total after this add?
        ),
        min_size=1,
        max_size=120,
    ),
)
def test_rolling_total_equals_brute_force_sum(window_s, buckets, steps) -> None:
    rw = RollingWindow(window_s, buckets=buckets)
    t = 1_000_000.0
    events: list[tuple[float, float]] = []
    for dt, value, query in steps:
        t += dt * window_s / 10
        rw.add(t, value)
        events.append((t, value))
        if query:
            expected = brute_force(events, t, window_s, buckets)
            assert rw.total(t) == pytest.approx(expected, rel=1e-9, abs=1e-6)
    later = t + window_s * 0.37
    assert rw.total(later) == pytest.approx(
        brute_force(events, later, window_s, buckets), rel=1e-9, abs=1e-6
    )
    assert rw.total(t + 2 * window_s) == 0.0


def test_exact_bucket_semantics() -> None:
    rw = RollingWindow(60.0, buckets=6)  # 10 s buckets
    rw.add(0.0, 1)  # bucket 0
    rw.add(9.99, 2)  # bucket 0
    rw.add(10.0, 4)  # bucket 1
    assert rw.total(59.99) == 7  # buckets 0..5 all live
    assert rw.total(60.0) == 4  # bucket 6 live -> bucket 0 gone: up to 10 s early
    assert rw.total(69.99) == 4
    assert rw.total(70.0) == 0


def test_late_events_land_in_their_bucket_or_are_dropped() -> None:
    rw = RollingWindow(60.0, buckets=6)
    rw.add(100.0, 1)
    rw.add(95.0, 2)  # late but in the window
    rw.add(10.0, 100)  # expired long ago
    assert rw.total(100.0) == 3
    assert rw.total(50.0) == 3  # time does not go backwards


def test_memory_is_bounded() -> None:
    rw = RollingWindow(3600, buckets=60)
    before = sys.getsizeof(rw._sums) + sys.getsizeof(rw._ids)
    for i in range(20_000):
        rw.add(i * 0.7, 1.0)
    assert sys.getsizeof(rw._sums) + sys.getsizeof(rw._ids) == before
    assert rw.total(20_000 * 0.7) <= 3600 / 0.7 + 1


@pytest.mark.parametrize(
    ("window_s", "buckets", "value"),
    [(0, 60, 1.0), (-1, 60, 1.0), (math.inf, 60, 1.0), (60, 0, 1.0), (60, 60, math.nan)],
)
def test_invalid_input(window_s, buckets, value) -> None:
    with pytest.raises(InvalidInput):
        RollingWindow(window_s, buckets=buckets).add(1.0, value)


# -- tenant budgets -------------------------------------------------------------------------


def tenant(**kw) -> TenantBudget:
    rolling = tuple(RollingLimit(m, lim, w) for m, lim, w in kw.pop("rolling", ()))
    return TenantBudget("acme", TenantLimits(rolling=rolling, **kw))


def test_concurrent_runs_cap() -> None:
    tb = tenant(max_concurrent_runs=2)
    assert tb.admit(0).action is Action.CONTINUE
    assert tb.admit(0).action is Action.CONTINUE
    d = tb.admit(0)
    assert (d.action, d.status, d.reason) == (Action.STOP, Status.TERMINATED, Reason.TENANT_BUDGET)
    assert "max_concurrent_runs 2 reached (live_runs=2)" in d.message
    tb.run_ended()
    assert tb.admit(0).action is Action.CONTINUE
    assert tb.live_runs == 2
    for _ in range(5):
        tb.run_ended()
    assert tb.live_runs == 0


@pytest.mark.parametrize(
    ("metric", "delta", "value"),
    [
        ("cost_usd", Usage(cost_usd=0.6), 0.6),
        ("tokens", Usage(input_tokens=400, output_tokens=200), 600),
        ("input_tokens", Usage(input_tokens=600, output_tokens=999), 600),
        ("output_tokens", Usage(output_tokens=600, input_tokens=999), 600),
        ("steps", Usage(steps=600), 600),
        ("tool_calls", Usage(tool_calls=600), 600),
    ],
)
def test_every_metric_is_counted(metric: str, delta: Usage, value: float) -> None:
    limit = 1.0 if metric == "cost_usd" else 1000
    tb = tenant(rolling=[(metric, limit, 60)])
    assert tb.record(0, delta).action is Action.CONTINUE
    assert tb.status(0) == [(metric, 60, pytest.approx(value), limit)]
    d = tb.record(1, delta)
    assert d.stop and d.reason is Reason.TENANT_BUDGET and d.metric == metric
    assert tb.exhausted(1) == (metric, pytest.approx(2 * value), limit)
    assert tb.admit(2).stop  # new runs are denied too
    assert tb.exhausted(200) is None and tb.admit(200).action is Action.CONTINUE


def test_runs_metric_counts_admissions() -> None:
    tb = tenant(rolling=[("runs", 3, 60)])
    assert [tb.admit(t).action for t in (0, 1, 2)] == [Action.CONTINUE] * 3
    d = tb.admit(3)
    assert d.stop and "runs 3 reached its limit 3 per 60s" in d.message
    assert tb.admit(61).action is Action.CONTINUE


def test_tenant_reservations_never_oversell() -> None:
    tb = tenant(rolling=[("cost_usd", 1.0, 3600)])
    barrier = threading.Barrier(32)
    got = []

    def worker() -> None:
        barrier.wait()
        with contextlib.suppress(BudgetExceeded):
            got.append(tb.reserve(10, cost_usd=0.1))

    threads = [threading.Thread(target=worker) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 10
    for r in got[:5]:
        r.settle(20, Usage(cost_usd=0.05))
    for r in got[5:]:
        r.release()
    assert tb.status(20)[0][2] == pytest.approx(0.25)


def test_tenant_reservation_context_manager() -> None:
    tb = tenant(rolling=[("tokens", 100, 60)])
    with tb.reserve(0, tokens=80):
        with pytest.raises(BudgetExceeded) as exc:
            tb.reserve(0, tokens=30)
        assert exc.value.metric == "tokens" and exc.value.available == pytest.approx(20)
    tb.reserve(0, tokens=100)


def test_set_limits_keeps_unchanged_windows() -> None:
    keep = RollingLimit("tokens", 100, 60)
    tb = TenantBudget("acme", TenantLimits(rolling=(keep,)))
    tb.record(0, Usage(input_tokens=50))
    tb.set_limits(TenantLimits(max_concurrent_runs=1, rolling=(keep, RollingLimit("steps", 5, 60))))
    assert [s[2] for s in tb.status(1)] == [50, 0]


def test_rolling_window_saturates_instead_of_overflowing() -> None:
    w = RollingWindow(60.0)
    w.add(0.0, 1.7e308)
    w.add(0.0, 1.7e308)
    assert math.isfinite(w.total(0.0)) and w.total(0.0) > 1e299
