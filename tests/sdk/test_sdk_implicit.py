"""Implicit estimates: a step or paid tool call reserved by nothing explicit holds the run's
mean per step (per call of that tool) while it runs, so parallel callers of one run overshoot
a budget by the estimate's error, not by a call each."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from typing import Any

import pytest

import guard
from guard.policy import Limits, PolicyConfig
from guard.sdk._decorator import _make_spec
from guard.sdk._run import current_run_or_none
from guard.testing import SpanSink
from guard.wire import limits_from_pb, limits_to_pb

_OFF = Limits(implicit_estimates=False)


def _parallel(n: int, fn) -> None:
    """Run ``fn()`` in ``n`` threads started together (each in a copy of this context)."""
    barrier = threading.Barrier(n)

    def body() -> None:
        barrier.wait()
        fn()

    threads = [
        threading.Thread(target=contextvars.copy_context().run, args=(body,)) for _ in range(n)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)


def _eight_threads_of_steps(limits: Limits | None) -> tuple[list[int], list[guard.RunStopped]]:
    """8 threads of one run (max_cost_usd 0.10), each taking steps whose model call costs
    $0.01 and is recorded after the fact, until the run stops."""
    calls: list[int] = []
    stops: list[guard.RunStopped] = []

    @guard.run(agent="eight", max_cost_usd=0.10, limits=limits)
    def agent() -> None:
        def loop() -> None:
            try:
                for _ in range(100):  # bounded: a broken stop must not hang the suite
                    with guard.step() as step:
                        time.sleep(0.02)  # the call, in flight in all 8 threads at once
                        calls.append(1)
                        step.model_call(
                            model="gpt-4.1", input_tokens=1000, output_tokens=200, cost_usd=0.01
                        )
            except guard.RunStopped as exc:
                stops.append(exc)

        _parallel(8, loop)

    try:
        agent()
    except guard.RunStopped as exc:
        stops.append(exc)
    return calls, stops


def test_eight_threads_of_after_the_fact_steps_stay_within_the_estimates_error(
    sink: SpanSink,
) -> None:
    calls, stops = _eight_threads_of_steps(None)
    # Without implicit estimates this made ~18 calls against a limit of 10: every thread
    # passed the check before any of them had spent.
    assert len(calls) <= 11, len(calls)
    assert stops and all(s.outcome.reason == "cost_budget" for s in stops)
    implicit = [s for s in stops if "implicit estimate" in s.outcome.message]
    assert implicit, [s.outcome.message for s in stops]
    msg = implicit[0].outcome.message
    assert "0.01 cost_usd" in msg and "the run's mean per step" in msg, msg


def test_with_implicit_estimates_off_no_step_holds_an_estimate(sink: SpanSink) -> None:
    calls, stops = _eight_threads_of_steps(_OFF)
    assert len(calls) >= 10  # the old behaviour: the stop comes after the fact
    assert stops and all(s.outcome.reason == "cost_budget" for s in stops)
    assert not any("implicit" in s.outcome.message for s in stops)


def test_a_step_holds_the_mean_until_its_model_call_settles_it(sink: SpanSink) -> None:
    seen: dict[str, Any] = {}

    @guard.run(agent="r", max_cost_usd=1.0)
    def agent() -> None:
        budget = current_run_or_none().budget
        with guard.step() as step:  # the first step: no mean yet, nothing held
            seen["first"] = budget.reserved().cost_usd
            step.model_call(model="gpt-4.1", input_tokens=100, output_tokens=10, cost_usd=0.02)
            step.model_call(model="gpt-4.1", input_tokens=100, output_tokens=10, cost_usd=0.02)
        with guard.step() as step:
            seen["held"] = budget.reserved()
            step.model_call(model="gpt-4.1", input_tokens=100, output_tokens=10, cost_usd=0.01)
            seen["settled"] = budget.reserved().cost_usd
        with guard.step():
            seen["again"] = budget.reserved().cost_usd
        seen["end"] = (budget.reserved().cost_usd, budget.usage().cost_usd)

    agent()
    assert not seen["first"]
    # the mean per step is the step's total (two calls), tokens too
    assert seen["held"].cost_usd == pytest.approx(0.04) and seen["held"].tokens == 220
    assert seen["settled"] == pytest.approx(0.0)
    assert seen["again"] == pytest.approx(0.025)  # (0.04 + 0.01) / 2
    reserved, used = seen["end"]
    assert reserved == pytest.approx(0.0) and used == pytest.approx(0.05)  # released, counted once


def test_the_first_step_is_never_refused_by_an_estimate(sink: SpanSink) -> None:
    calls = []

    @guard.run(agent="r", max_cost_usd=0.05)
    def agent() -> None:
        while True:
            with guard.step() as step:
                calls.append(1)
                step.model_call(model="gpt-4.1", cost_usd=0.04)

    with pytest.raises(guard.RunStopped) as stop:
        agent()
    o = stop.value.outcome
    # the first call runs (nothing to estimate from); the second's estimate (0.04) does not
    # fit the 0.01 left, so it never starts
    assert len(calls) == 1 and o.reason == "cost_budget", o
    assert "implicit estimate 0.04 cost_usd" in o.message and "over 1 step" in o.message, o.message
    assert "available 0.01" in o.message, o.message


def test_an_explicit_reservation_wins_over_the_implicit_estimate(sink: SpanSink) -> None:
    seen: dict[str, Any] = {}

    @guard.run(agent="r", max_cost_usd=0.15)
    def agent() -> None:
        budget = current_run_or_none().budget
        with guard.step() as step:
            step.model_call(model="gpt-4.1", cost_usd=0.06)
        with guard.step() as step:
            seen["implicit"] = budget.reserved().cost_usd
            # 0.06 used + 0.06 implicit + 0.05 would not fit: the implicit one goes first
            with step.reserve(cost_usd=0.05):
                seen["explicit"] = budget.reserved().cost_usd
                step.model_call(model="gpt-4.1", cost_usd=0.05)
            seen["after"] = budget.reserved().cost_usd
        with guard.step():  # the run reserves explicitly now: no implicit estimate
            seen["later"] = budget.reserved().cost_usd
        seen["used"] = budget.usage().cost_usd

    agent()
    assert seen["implicit"] == pytest.approx(0.06)
    assert seen["explicit"] == pytest.approx(0.05)
    assert seen["after"] == pytest.approx(0.0) and seen["later"] == pytest.approx(0.0)
    assert seen["used"] == pytest.approx(0.11)


def test_an_async_step_holds_the_mean_too(sink: SpanSink) -> None:
    @guard.run(agent="a", max_cost_usd=0.05)
    async def agent() -> None:
        while True:
            async with guard.step() as step:
                await asyncio.sleep(0)
                step.model_call(model="gpt-4.1", cost_usd=0.02)

    with pytest.raises(guard.RunStopped) as stop:
        asyncio.run(agent())
    o = stop.value.outcome
    assert o.reason == "cost_budget" and "implicit estimate 0.02" in o.message, o.message
    assert o.cost_usd == pytest.approx(0.04)  # a third call (0.06) never started


def test_token_budgets_use_the_mean_tokens_per_step(sink: SpanSink) -> None:
    calls = []

    @guard.run(agent="t", max_tokens=2_500)
    def agent() -> None:
        while True:
            with guard.step() as step:
                calls.append(1)
                step.model_call(model="unpriced-model", input_tokens=900, output_tokens=100)

    with pytest.raises(guard.RunStopped) as stop:
        agent()
    o = stop.value.outcome
    assert len(calls) == 2 and o.reason == "token_budget", o
    assert "implicit estimate 1000 tokens" in o.message, o.message


# -- paid tools -------------------------------------------------------------------------------
def _calls(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {"id": f"c{i}", "name": "lookup", "args": {"order": i}} for i in range(start, start + n)
    ]


def _paid_batches(limits: Limits | None) -> tuple[int, list[str], BaseException | None]:
    """Batches of 8 parallel tool calls admitted with no price; each call records $0.01."""
    seen: dict[str, Any] = {"ran": 0, "messages": []}
    lock = threading.Lock()

    @guard.run(agent="paid", max_cost_usd=0.10, max_steps=1000, limits=limits)
    def agent() -> None:
        for b in range(30):
            with guard.step() as step, guard.admit_tools(_calls(8, 8 * b)) as batch:
                admitted = iter(batch.admitted)

                def one(step: Any = step, admitted: Any = admitted) -> None:
                    with lock:
                        c = next(admitted, None)
                    if c is None:
                        return
                    time.sleep(0.01)
                    with lock:
                        seen["ran"] += 1
                    step.tool_call("lookup", c["args"], result=c["id"], cost_usd=0.01)

                _parallel(8, one)
                if batch.rejected:
                    seen["messages"].append(batch.rejection(batch.rejected[0])["content"])

    stop = None
    try:
        agent()
    except guard.RunStopped as exc:
        stop = exc
        seen["messages"].append(exc.outcome.message)
    return seen["ran"], seen["messages"], stop


def test_paid_tools_without_a_price_hold_the_tools_mean_cost(sink: SpanSink) -> None:
    ran, messages, stop = _paid_batches(None)
    # Without implicit estimates: 16 calls ran against a limit of 10 (8 per batch admitted
    # free, the stop only after the second batch had spent).
    assert ran <= 11, ran
    assert stop is not None and stop.outcome.reason == "cost_budget", messages
    assert "implicit estimate 0.01 cost_usd" in stop.outcome.message, stop.outcome.message
    assert "mean per call of 'lookup'" in stop.outcome.message


def test_paid_tools_with_implicit_estimates_off_hold_nothing(sink: SpanSink) -> None:
    ran, messages, _ = _paid_batches(_OFF)
    assert ran >= 10
    assert not any("implicit" in m for m in messages), messages


def test_a_guard_tool_without_a_price_holds_its_mean_and_the_first_call_is_free(
    sink: SpanSink,
) -> None:
    ran = []

    @guard.tool
    def search(q: str) -> str:
        ran.append(q)
        return "ok"

    @guard.run(agent="g", max_cost_usd=0.05)
    def agent() -> None:
        with guard.step() as step:
            # the first priced call of "search": nothing to estimate from
            step.tool_call("search", {"q": "priced"}, cost_usd=0.04)
        with guard.step():
            search("x")  # holds the mean (0.04): 0.04 + 0.04 > 0.05

    with pytest.raises(guard.RunStopped) as stop:
        agent()
    o = stop.value.outcome
    assert ran == [] and o.reason == "cost_budget", o
    assert "implicit estimate 0.04 cost_usd (the run's mean per call of 'search'" in o.message


# -- the policy switch ----------------------------------------------------------------------
def test_the_policy_switch_is_validated_carried_on_the_wire_and_reaches_the_run() -> None:
    assert Limits().implicit_estimates is True
    off = PolicyConfig.from_dict({"runs": {"implicit_estimates": False}})
    assert off.runs.implicit_estimates is False
    assert PolicyConfig.from_dict(off.to_dict()) == off
    with pytest.raises(guard.errors.ConfigError, match=r"runs\.implicit_estimates"):
        PolicyConfig.from_dict({"runs": {"implicit_estimates": "no"}})
    with pytest.raises(guard.errors.ConfigError, match="implicit_estimatez"):
        PolicyConfig.from_dict({"runs": {"implicit_estimatez": False}})
    # the guard's Welcome carries it; an older guard that does not is read as on
    assert limits_from_pb(limits_to_pb(off.runs)).implicit_estimates is False
    assert limits_from_pb(limits_to_pb(Limits())).implicit_estimates is True
    unset = limits_to_pb(Limits())
    unset.ClearField("implicit_estimates")
    assert limits_from_pb(unset).implicit_estimates is True
    # the policy's off wins over a decorator that says nothing about it
    spec = _make_spec("a", None, None, {"max_steps": 5}, None, None, (), None)
    assert spec.effective(off.runs).implicit_estimates is False
    assert spec.effective(Limits()).implicit_estimates is True


def test_steps_in_flight_when_the_first_mean_appears_hold_it_and_give_it_back(
    sink: SpanSink,
) -> None:
    seen: dict[str, Any] = {}
    first_done, second_in = threading.Event(), threading.Event()

    @guard.run(agent="r", max_cost_usd=1.0)
    def agent() -> None:
        budget = current_run_or_none().budget

        def slow() -> None:  # begins before any mean, records nothing, ends after it
            with guard.step():
                second_in.set()
                first_done.wait(5)
                seen["in_flight"] = budget.reserved().cost_usd

        t = threading.Thread(target=contextvars.copy_context().run, args=(slow,))
        t.start()
        second_in.wait(5)
        with guard.step() as step:  # the run's first mean: 0.03
            step.model_call(model="gpt-4.1", cost_usd=0.03)
        first_done.set()
        t.join(5)
        seen["end"] = budget.reserved().cost_usd

    agent()
    assert seen["in_flight"] == pytest.approx(0.03)  # held from the first mean on
    assert seen["end"] == pytest.approx(0.0)  # and released when it ended without a call


def test_a_step_that_ended_before_the_first_mean_holds_nothing_afterwards(sink: SpanSink) -> None:
    seen: dict[str, Any] = {}

    @guard.run(agent="r", max_cost_usd=1.0)
    def agent() -> None:
        budget = current_run_or_none().budget
        with guard.step():
            pass  # no call, no mean yet
        with guard.step() as step:
            step.model_call(model="gpt-4.1", cost_usd=0.03)  # the first mean
        seen["reserved"] = budget.reserved().cost_usd

    agent()
    assert not seen["reserved"]  # None: nothing was ever held
