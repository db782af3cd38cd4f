"""Budget vector, reservations, deadline clock, pause/resume, effective timeout."""

from __future__ import annotations

import math
import threading

import pytest
from _hyp import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from guard.errors import BudgetExceeded, GuardError, InvalidInput
from guard.policy import Action, Budget, Limits, Phase, Reason, Remaining, Status


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


def test_counters_are_kept_apart() -> None:
    b = Budget(Limits())
    b.record_step()
    b.record_step()
    b.record_model_call(input_tokens=100, output_tokens=20, reasoning_tokens=5, cached_tokens=40)
    b.record_tool_calls(3, attempts=5)
    b.record_tool_calls()
    u = b.usage()
    assert (u.steps, u.model_calls, u.tool_calls, u.tool_attempts) == (2, 1, 4, 6)
    assert (u.input_tokens, u.output_tokens, u.reasoning_tokens, u.cached_tokens) == (
        100,
        20,
        5,
        40,
    )
    assert u.tokens == 120


def test_usage_is_a_snapshot_copy() -> None:
    b = Budget(Limits())
    u = b.usage()
    u.steps = 99
    assert b.usage().steps == 0


def test_cost_none_means_unpriced_until_a_priced_call() -> None:
    b = Budget(Limits(max_cost_usd=1.0))
    b.record_model_call(input_tokens=10)
    assert b.usage().cost_usd is None
    assert b.decide().action is Action.CONTINUE
    b.record_model_call(input_tokens=10, cost_usd=0.25)
    b.record_tool_calls(cost_usd=0.05)
    assert b.usage().cost_usd == pytest.approx(0.30)


@pytest.mark.parametrize(
    ("call", "kwargs"),
    [
        ("record_model_call", {"input_tokens": -1}),
        ("record_model_call", {"output_tokens": 1.5}),
        ("record_model_call", {"cached_tokens": True}),
        ("record_model_call", {"cost_usd": math.nan}),
        ("record_model_call", {"cost_usd": math.inf}),
        ("record_model_call", {"cost_usd": -0.01}),
        ("record_tool_calls", {"n": -2}),
        ("record_tool_calls", {"attempts": -1}),
        ("record_tool_calls", {"cost_usd": "1"}),
        ("reserve", {"tokens": -5}),
        ("reserve", {"cost_usd": math.nan}),
        ("reserve", {"ttl_s": 0}),
    ],
)
def test_bad_input_is_rejected_without_corrupting_state(call: str, kwargs: dict) -> None:
    b = Budget(Limits(max_tokens=100))
    with pytest.raises(InvalidInput) as exc:
        getattr(b, call)(**kwargs)
    assert isinstance(exc.value, GuardError)
    assert b.usage().tokens == 0 and b.usage().model_calls == 0 and b.outstanding == 0


def test_deadline_uses_the_injected_monotonic_clock() -> None:
    clock = FakeClock()
    b = Budget(Limits(deadline_s=10.0), clock=clock)
    assert b.elapsed_s() == 0.0
    clock.advance(9.5)
    assert b.decide().action is not Action.STOP
    clock.advance(0.5)
    d = b.decide()
    assert (d.action, d.status, d.reason) == (Action.STOP, Status.TERMINATED, Reason.DEADLINE)
    assert "deadline_s 10 reached (elapsed_s=10.000)" in d.message


@pytest.mark.parametrize(
    ("freezes", "expected_elapsed"),
    [(True, 3.0), (False, 8.0)],
)
def test_pause_is_not_a_stop_and_may_freeze_the_deadline(
    freezes: bool, expected_elapsed: float
) -> None:
    clock = FakeClock()
    b = Budget(Limits(deadline_s=6.0, pause_freezes_deadline=freezes), clock=clock)
    clock.advance(2.0)
    b.pause()
    b.pause()  # idempotent
    assert b.paused
    clock.advance(5.0)
    b.resume()
    b.resume()
    assert not b.paused
    clock.advance(1.0)
    assert b.elapsed_s() == pytest.approx(expected_elapsed)
    assert (b.decide().action is Action.STOP) is (not freezes)


def test_elapsed_is_frozen_while_paused() -> None:
    clock = FakeClock()
    b = Budget(Limits(pause_freezes_deadline=True), clock=clock)
    clock.advance(1.0)
    b.pause()
    clock.advance(100.0)
    assert b.elapsed_s() == pytest.approx(1.0)


def test_remaining_is_net_of_reservations_and_final_answer_reserve() -> None:
    clock = FakeClock()
    lim = Limits(
        max_steps=10,
        max_tokens=1000,
        reserve_tokens=100,
        max_cost_usd=1.0,
        max_tool_calls=5,
        max_model_calls=4,
        deadline_s=60.0,
        reserve_s=10.0,
    )
    b = Budget(lim, clock=clock)
    b.record_step()
    b.record_model_call(input_tokens=300, output_tokens=100, cost_usd=0.2)
    b.record_tool_calls(2)
    b.reserve(tokens=50, cost_usd=0.1, tool_calls=1)
    clock.advance(20.0)
    assert b.remaining() == Remaining(
        seconds=30.0,
        steps=9,
        tokens=1000 - 400 - 50 - 100,
        cost_usd=pytest.approx(0.7),
        tool_calls=2,
        model_calls=3,
    )


def test_remaining_is_never_negative_and_none_when_unlimited() -> None:
    clock = FakeClock()
    b = Budget(Limits(max_tokens=10, deadline_s=1.0), clock=clock)
    b.record_model_call(input_tokens=50)
    clock.advance(5)
    r = b.remaining()
    assert r.tokens == 0 and r.seconds == 0.0
    assert r.steps is None and r.cost_usd is None and r.tool_calls is None


@pytest.mark.parametrize(
    ("deadline", "reserve", "margin", "elapsed", "configured", "final", "expected"),
    [
        (None, None, 0.5, 0.0, None, False, None),
        (None, None, 0.5, 0.0, 7.0, False, 7.0),
        (60.0, None, 0.5, 0.0, 10.0, False, 10.0),
        (60.0, None, 0.5, 55.0, 10.0, False, 4.5),  # seed 000 §4.2: 4 s left -> a bit under
        (60.0, None, 0.5, 55.0, None, False, 4.5),
        (60.0, None, 0.5, 59.6, 10.0, False, 0.0),  # zero before the deadline
        (60.0, None, 0.5, 80.0, 10.0, False, 0.0),
        (60.0, 10.0, 0.5, 45.0, 30.0, False, 4.5),  # the reserve is not for ordinary I/O
        (60.0, 10.0, 0.5, 45.0, 30.0, True, 14.5),  # ... but the final answer may use it
        (60.0, None, 0.0, 30.0, 1.0, False, 1.0),
    ],
)
def test_effective_timeout(deadline, reserve, margin, elapsed, configured, final, expected) -> None:
    clock = FakeClock()
    b = Budget(Limits(deadline_s=deadline, reserve_s=reserve, timeout_margin_s=margin), clock=clock)
    clock.advance(elapsed)
    got = b.effective_timeout(configured, final_answer=final)
    assert got == (None if expected is None else pytest.approx(expected))


def test_effective_timeout_reaches_zero_strictly_before_the_deadline() -> None:
    clock = FakeClock()
    b = Budget(Limits(deadline_s=5.0), clock=clock)
    t = 0.0
    while b.effective_timeout(10.0) > 0:
        clock.advance(0.01)
        t += 0.01
    assert t < 5.0
    assert b.decide().action is not Action.STOP


def test_utilisation_names_the_highest_metric() -> None:
    clock = FakeClock()
    b = Budget(Limits(max_steps=10, max_tokens=100, deadline_s=10), clock=clock)
    assert b.utilisation() == (0.0, "elapsed_s")
    b.record_step()
    b.record_model_call(input_tokens=50)
    assert b.utilisation() == (0.5, "tokens")
    assert Budget(Limits()).utilisation() == (None, None)


# -- reservations ----------------------------------------------------------------------------


def test_reserve_then_settle_records_actual_and_frees_estimate() -> None:
    b = Budget(Limits(max_tokens=1000, max_cost_usd=1.0, max_tool_calls=3))
    r = b.reserve(tokens=400, cost_usd=0.5, tool_calls=1)
    assert b.reserved().tokens == 400
    r.settle(input_tokens=120, output_tokens=30, cost_usd=0.2, tool_calls=1)
    u = b.usage()
    assert (u.input_tokens, u.output_tokens, u.tool_calls) == (120, 30, 1)
    assert u.cost_usd == pytest.approx(0.2)
    assert b.reserved().tokens == 0 and b.outstanding == 0
    r.settle(tokens=999)  # settling twice is a no-op
    assert b.usage().tokens == 150


def test_reservation_blocks_oversell_with_numbers() -> None:
    b = Budget(Limits(max_cost_usd=0.10))
    b.record_model_call(cost_usd=0.05)
    b.reserve(cost_usd=0.04)
    with pytest.raises(BudgetExceeded) as exc:
        b.reserve(cost_usd=0.02)
    e = exc.value
    assert e.metric == "cost_usd" and e.requested == pytest.approx(0.02)
    assert e.available == pytest.approx(0.01)
    assert "limit 0.1" in str(e)


def test_context_manager_releases_unsettled() -> None:
    b = Budget(Limits(max_tokens=100))
    with b.reserve(tokens=80), pytest.raises(BudgetExceeded):
        b.reserve(tokens=30)
    assert b.reserved().tokens == 0
    with b.reserve(tokens=80) as r:
        r.settle(tokens=10)
    assert b.usage().tokens == 10 and b.outstanding == 0


def test_context_manager_releases_on_exception() -> None:
    b = Budget(Limits(max_tool_calls=1))
    with pytest.raises(RuntimeError), b.reserve(tool_calls=1):
        raise RuntimeError("tool crashed")
    b.reserve(tool_calls=1)  # the slot is free again


def test_ttl_expiry_and_release_expired() -> None:
    clock = FakeClock()
    b = Budget(Limits(max_tokens=100), clock=clock)
    b.reserve(tokens=60, ttl_s=5)
    b.reserve(tokens=30)
    clock.advance(4.9)
    assert b.release_expired() == 0
    clock.advance(0.2)
    assert b.release_expired() == 1
    assert b.reserved().tokens == 30
    # reserve() also sweeps expired reservations before checking
    b.reserve(tokens=20, ttl_s=1)
    clock.advance(2)
    b.reserve(tokens=70)
    assert b.reserved().tokens == 100


def test_settle_after_expiry_still_records_actual() -> None:
    clock = FakeClock()
    b = Budget(Limits(max_tokens=100), clock=clock)
    r = b.reserve(tokens=60, ttl_s=1)
    clock.advance(2)
    assert b.release_expired() == 1
    r.settle(tokens=5)  # already freed: recording nothing twice, freeing nothing twice
    assert b.reserved().tokens == 0


def test_nested_runs_count_against_the_parent() -> None:
    parent = Budget(Limits(max_tokens=1000, max_steps=5))
    child = Budget(Limits(max_tokens=800), parent=parent)
    child.record_step()
    child.record_model_call(input_tokens=600)
    assert parent.usage().tokens == 600 and parent.usage().steps == 1
    assert child.usage().tokens == 600
    parent.record_model_call(input_tokens=300)
    assert child.usage().tokens == 600  # usage flows up, never down
    with pytest.raises(BudgetExceeded):
        child.reserve(tokens=150)  # fits the child (200 left) but not the parent (100 left)
    r = child.reserve(tokens=100)
    assert parent.reserved().tokens == 100
    r.release()
    assert parent.reserved().tokens == 0
    grandchild = Budget(Limits(), parent=child)
    grandchild.record_tool_calls(2)
    assert parent.usage().tool_calls == 2 and child.usage().tool_calls == 2
    assert parent.decide().action is Action.WRAP_UP  # 900/1000 tokens: 90% soft threshold


def test_set_limits_replaces() -> None:
    b = Budget(Limits(max_steps=10))
    b.record_step()
    b.set_limits(Limits(max_steps=1))
    assert b.limits.max_steps == 1
    assert b.decide(phase=Phase.BEFORE_STEP).reason is Reason.MAX_STEPS


@settings(max_examples=examples(15), deadline=None)
@given(
    limit=st.integers(min_value=1, max_value=200),
    sizes=st.lists(st.integers(min_value=1, max_value=9), min_size=32, max_size=32),
    settle_fraction=st.floats(min_value=0.0, max_value=1.0),
    nested=st.booleans(),
)
def test_32_threads_never_oversell(
    limit: int, sizes: list[int], settle_fraction: float, nested: bool
) -> None:
    root = Budget(Limits(max_tokens=limit, max_tool_calls=limit))
    b = Budget(Limits(), parent=root) if nested else root
    barrier = threading.Barrier(32)
    granted: list[int] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        barrier.wait()
        for _ in range(3):
            try:
                r = b.reserve(tokens=n, tool_calls=1)
            except BudgetExceeded:
                continue
            with lock:
                granted.append(n)
            # Settle for the actual amount (<= estimate) or release.
            if n * settle_fraction >= 1:
                r.settle(tokens=int(n * settle_fraction), tool_calls=1)
            else:
                r.release()

    threads = [threading.Thread(target=worker, args=(n,)) for n in sizes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    u = root.usage()
    assert u.tokens <= limit
    assert u.tool_calls <= limit
    assert root.reserved().tokens == 0 and root.reserved().tool_calls == 0
    assert b.outstanding == 0


def test_concurrent_reservations_held_never_exceed_the_limit() -> None:
    """All 32 threads hold their reservation at once: the granted total fits the budget."""
    b = Budget(Limits(max_cost_usd=0.10))
    barrier = threading.Barrier(32)
    held: list[object] = []
    lock = threading.Lock()

    def worker() -> None:
        barrier.wait()
        try:
            r = b.reserve(cost_usd=0.01)
        except BudgetExceeded:
            return
        with lock:
            held.append(r)

    threads = [threading.Thread(target=worker) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(held) == 10
    assert b.reserved().cost_usd == pytest.approx(0.10)


def test_parent_sweeps_expired_reservations_of_an_abandoned_nested_run() -> None:
    clock = FakeClock()
    parent = Budget(Limits(max_tokens=100), clock=clock)
    child = Budget(Limits(), clock=clock, parent=parent)
    child.reserve(tokens=90, ttl_s=5)
    assert parent.outstanding == 1 and child.outstanding == 1
    with pytest.raises(BudgetExceeded):
        parent.reserve(tokens=20)
    clock.advance(6)
    assert parent.release_expired() == 1
    assert parent.outstanding == 0 and child.outstanding == 0
    assert parent.reserved().tokens == 0 and child.reserved().tokens == 0
    parent.reserve(tokens=100)
