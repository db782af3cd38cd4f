"""``step.reserve``: estimates held before a call, settled exactly once, always released."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest
from _wait import wait_until_async

import guard
from guard.sdk._run import current_run_or_none
from guard.testing import SpanSink


def _parallel(n: int, fn) -> list[BaseException | None]:
    """Run ``fn()`` in ``n`` threads at once (each in a copy of this context: the run's)."""
    barrier = threading.Barrier(n)
    errors: list[BaseException | None] = [None] * n

    def body(i: int) -> None:
        barrier.wait()
        try:
            fn()
        except BaseException as exc:
            errors[i] = exc

    threads = [
        threading.Thread(target=contextvars.copy_context().run, args=(body, i)) for i in range(n)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return errors


def test_reserve_settles_with_the_model_call_and_releases_without_one(sink: SpanSink) -> None:
    seen = {}

    @guard.run(agent="r", max_cost_usd=0.10, max_tokens=10_000)
    def agent() -> None:
        run = current_run_or_none()
        with guard.step() as step, step.reserve(cost_usd=0.04, tokens=4_000):
            seen["held"] = run.budget.reserved()
            step.model_call(model="gpt-4.1", input_tokens=100, output_tokens=10, cost_usd=0.03)
            seen["after_call"] = run.budget.reserved()
            step.model_call(model="gpt-4.1", input_tokens=1, output_tokens=1, cost_usd=0.001)
        with guard.step() as step, step.reserve(cost_usd=0.05):
            pass  # no call: released
        seen["end"] = (run.budget.reserved(), run.budget.usage())

    agent()
    assert seen["held"].cost_usd == pytest.approx(0.04) and seen["held"].tokens == 4_000
    assert seen["after_call"].cost_usd == pytest.approx(0.0) and seen["after_call"].tokens == 0
    reserved, usage = seen["end"]
    assert reserved.cost_usd == pytest.approx(0.0)
    assert usage.model_calls == 2 and usage.cost_usd == pytest.approx(0.031)  # recorded once


def test_a_reservation_that_does_not_fit_stops_the_run_before_the_call(sink: SpanSink) -> None:
    calls = []

    @guard.run(agent="r", max_cost_usd=0.10)
    def agent() -> None:
        while True:
            with guard.step() as step, step.reserve(cost_usd=0.04):
                calls.append(1)
                step.model_call(model="gpt-4.1", cost_usd=0.04)

    with pytest.raises(guard.RunStopped) as stop:
        agent()
    o = stop.value.outcome
    assert (o.reason, o.decided_by) == ("cost_budget", "sdk")
    assert "cost_usd=0.04" in o.message and "available 0.02" in o.message, o.message
    assert len(calls) == 2 and o.cost_usd == pytest.approx(0.08)


def test_tokens_only_with_a_model_is_priced_from_the_price_book(sink: SpanSink) -> None:
    seen = {}

    @guard.run(agent="r")
    def agent() -> None:
        with guard.step() as step, step.reserve(tokens=1_000_000, model="gpt-4.1"):
            seen["held"] = current_run_or_none().budget.reserved()

    agent()
    assert seen["held"].cost_usd == pytest.approx(8.0)  # the dearer (output) rate, per 1M


def test_exceptions_and_cancels_release_the_reservation(sink: SpanSink) -> None:
    seen = {}

    @guard.run(agent="r", max_cost_usd=0.10)
    def agent() -> None:
        run = current_run_or_none()
        for _ in range(5):  # 5 x 0.05 > 0.10: only fine if every failed call gave it back
            with pytest.raises(ValueError), guard.step() as step, step.reserve(cost_usd=0.05):
                raise ValueError("the model call failed")
        seen["reserved"] = run.budget.reserved().cost_usd

    agent()
    assert seen["reserved"] == pytest.approx(0.0)

    @guard.run(agent="a", max_cost_usd=0.10)
    async def aagent() -> None:
        run = current_run_or_none()

        async def one() -> None:
            async with guard.step() as step, step.reserve(cost_usd=0.05):
                await asyncio.sleep(10)

        task = asyncio.ensure_future(one())
        seen["held"] = await wait_until_async(
            lambda: run.budget.reserved().cost_usd, 10, "the reservation held"
        )
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        seen["async_reserved"] = run.budget.reserved().cost_usd
        async with guard.step() as step, step.reserve(cost_usd=0.10):
            step.model_call(model="gpt-4.1", cost_usd=0.10)

    asyncio.run(aagent())
    assert seen["held"] == pytest.approx(0.05) and seen["async_reserved"] == pytest.approx(0.0)


@pytest.mark.parametrize("max_cost_usd", [0.10, 0.15])
def test_eight_parallel_calls_in_one_run_never_pass_the_cost_limit(sink, max_cost_usd) -> None:
    seen = {}

    @guard.run(agent="par", max_cost_usd=max_cost_usd, max_steps=10_000)
    def agent() -> None:
        run = current_run_or_none()

        def worker() -> None:
            while True:
                with guard.step() as step, step.reserve(cost_usd=0.02):
                    step.model_call(model="gpt-4.1", input_tokens=10, cost_usd=0.02)

        errors = _parallel(8, worker)
        seen["errors"] = errors
        seen["usage"] = run.budget.usage()

    agent()  # the workers caught their stops
    assert all(isinstance(e, guard.RunStopped) for e in seen["errors"]), seen["errors"]
    u = seen["usage"]
    assert u.cost_usd <= max_cost_usd + 1e-9, u  # 0 overshoot beyond the reservation
    assert u.model_calls == int(max_cost_usd / 0.02 + 1e-9)


def test_async_tasks_in_one_run_never_pass_the_cost_limit(sink: SpanSink) -> None:
    seen = {}

    @guard.run(agent="apar", max_cost_usd=0.10, max_steps=10_000)
    async def agent() -> None:
        async def worker() -> None:
            while True:
                async with guard.step() as step, step.reserve(cost_usd=0.02):
                    await asyncio.sleep(0)  # the model call is in flight
                    step.model_call(model="gpt-4.1", cost_usd=0.02)

        results = await asyncio.gather(*(worker() for _ in range(8)), return_exceptions=True)
        seen["results"] = results
        seen["usage"] = guard.current_run().usage()

    asyncio.run(agent())
    assert all(isinstance(r, guard.RunStopped) for r in seen["results"])
    assert seen["usage"].model_calls == 5 and seen["usage"].cost_usd <= 0.10 + 1e-9


def test_nested_runs_reserve_against_the_parent(sink: SpanSink) -> None:
    @guard.run(agent="child")
    def child() -> None:
        while True:
            with guard.step() as step, step.reserve(cost_usd=0.03):
                step.model_call(model="gpt-4.1", cost_usd=0.03)

    @guard.run(agent="parent", max_cost_usd=0.10)
    def parent() -> float:
        with pytest.raises(guard.RunStopped) as stop:
            child()
        assert stop.value.outcome.reason == "cost_budget"
        return guard.current_run().usage().cost_usd

    assert parent() == pytest.approx(0.09)


def test_outside_a_run_reserve_is_a_no_op() -> None:
    with guard.step() as step, step.reserve(cost_usd=1.0):
        assert step.model_call(model="gpt-4.1", cost_usd=0.5) == 0.5
