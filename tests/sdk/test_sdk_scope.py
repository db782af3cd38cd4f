"""The one run scope (guard.sdk._scope.RunScope), the SDK's clock, the price book's rates and
the names the SDK emits (guard.semconv)."""

from __future__ import annotations

import asyncio
import threading

import pytest

import guard
from guard import semconv
from guard.errors import ConfigError
from guard.policy import DEFAULT_PRICE_BOOK, ModelPrice, PriceBook
from guard.sdk import _api, _config
from guard.sdk._clock import ManualClock
from guard.sdk._decorator import agent_spec
from guard.sdk._scope import RunScope
from guard.testing import SpanSink


def _spec(**limits):
    return guard.run(agent="scoped", **limits)(lambda: None).__guard_spec__


def _reason(sink: SpanSink) -> str:
    (span,) = sink.named("invoke_agent")
    return span.attributes["guard.stop.reason"]


# -- the run scope ------------------------------------------------------------------------------
def test_a_scope_is_the_current_run_and_its_cancel_comes_out_on_exit(sink: SpanSink) -> None:
    with pytest.raises(guard.RunStopped) as info, RunScope(_spec(max_steps=3)) as run:
        assert guard.current_run() is run.handle
        with guard.step():
            pass
        run.cancel("user_cancel")  # the block ends normally: the cancel still comes out
    assert info.value.outcome.reason == "user_cancel"
    assert guard.current_run().run_id == ""  # detached
    assert _reason(sink) == "user_cancel"


def test_a_stop_the_block_saw_and_caught_keeps_its_reason(sink: SpanSink) -> None:
    with RunScope(_spec(max_steps=1)):
        with guard.step():
            pass
        with pytest.raises(guard.RunStopped), guard.step():
            pass
    assert _reason(sink) == "max_steps"  # as @guard.run: not raised twice, not "completed"


def test_a_scope_lets_other_exceptions_through_and_records_the_failure(sink: SpanSink) -> None:
    with pytest.raises(KeyError), RunScope(agent_spec("scoped")):
        raise KeyError("x")
    (span,) = sink.named("invoke_agent")
    assert span.attributes["guard.stop.status"] == "failed"


def test_a_generator_closed_early_ends_its_run_as_completed(sink: SpanSink) -> None:
    def items():
        with RunScope(agent_spec("scoped")):
            for i in range(10):
                with guard.step():
                    yield i

    it = items()
    assert next(it) == 0 and next(it) == 1
    it.close()  # the caller stopped reading
    assert _reason(sink) == "final_answer"
    (span,) = sink.named("invoke_agent")
    assert span.attributes["guard.usage.steps"] == 2


async def test_an_async_scope_is_cancelled_from_another_thread(sink: SpanSink) -> None:
    started = threading.Event()
    box: dict = {}

    async def body() -> None:
        async with RunScope(agent_spec("scoped")) as run:
            box["run"] = run
            started.set()
            await asyncio.sleep(30)

    task = asyncio.ensure_future(body())
    await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
    threading.Thread(target=box["run"].cancel).start()
    with pytest.raises(guard.RunStopped) as info:
        await asyncio.wait_for(task, 10)
    assert info.value.outcome.reason == "user_cancel"


async def test_an_outside_cancel_of_an_async_scope_stays_a_cancellation(sink: SpanSink) -> None:
    inside = asyncio.Event()

    async def body() -> None:
        async with RunScope(agent_spec("scoped")):
            inside.set()
            await asyncio.sleep(30)

    task = asyncio.ensure_future(body())
    await asyncio.wait_for(inside.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (span,) = sink.named("invoke_agent")
    assert span.attributes["guard.stop.status"] == "cancelled"


# -- the clock ----------------------------------------------------------------------------------
def test_manual_clock_fires_due_timers_in_order_and_never_goes_back() -> None:
    clock = ManualClock()
    fired: list[str] = []
    clock.schedule(2.0, lambda: fired.append("b"))
    clock.schedule(1.0, lambda: fired.append("a"))
    clock.schedule(5.0, lambda: fired.append("late")).cancel()
    t0 = clock.monotonic()
    clock.advance(1.5)
    assert fired == ["a"] and clock.monotonic() == t0 + 1.5
    clock.advance(10.0)
    assert fired == ["a", "b"] and clock.pending() == 0
    with pytest.raises(ValueError, match="seconds=-1"):
        clock.advance(-1)


def test_configure_refuses_what_is_not_a_clock() -> None:
    with pytest.raises(ConfigError) as info:
        guard.configure(clock=object())
    assert info.value.path == "clock"


def test_configure_and_reset_live_in_the_api_module() -> None:
    assert guard.configure is _api.configure
    assert not hasattr(_config, "configure") and not hasattr(_config, "reset")


# -- prices -------------------------------------------------------------------------------------
def test_price_book_rates_serve_cost_usd() -> None:
    book = PriceBook("v", {"m": ModelPrice(2.0, 8.0, 0.5), "x": ModelPrice(1.0, 3.0)})
    assert book.rates("m-2025-01-01") == (2.0, 0.5, 8.0)  # the longest prefix, as price()
    assert book.rates("x") == (1.0, 1.0, 3.0)  # no cached price: billed as input
    assert book.rates("unknown") is None
    cost = book.cost_usd("m", input_tokens=1000, output_tokens=100, cached_tokens=400)
    assert cost == (600 * 2.0 + 400 * 0.5 + 100 * 8.0) / 1e6
    assert book.cost_usd("unknown", input_tokens=1, output_tokens=1) is None
    assert book == PriceBook("v", dict(book.models))  # the remembered rates are not state


def test_model_call_prices_from_a_policy_pushed_book(sink: SpanSink) -> None:
    rt = guard.sdk._runtime.get_runtime()
    box: dict = {}

    @guard.run(agent="priced")
    def f() -> None:
        with guard.step() as step:
            box["before"] = step.model_call(model="gpt-4.1", input_tokens=1000, output_tokens=0)
        rt.set_policy(None, PriceBook("pushed", {"gpt-4.1": ModelPrice(100.0, 0.0)}))
        with guard.step() as step:
            box["after"] = step.model_call(model="gpt-4.1", input_tokens=1000, output_tokens=0)

    f()
    assert box["before"] == DEFAULT_PRICE_BOOK.cost_usd(
        "gpt-4.1", input_tokens=1000, output_tokens=0
    )
    assert box["after"] == 0.1


# -- emitted names ------------------------------------------------------------------------------
def test_every_name_on_the_sdk_spans_comes_from_semconv(sink: SpanSink) -> None:
    emitted = {v for k, v in vars(semconv).items() if k.isupper() and isinstance(v, str)}

    @guard.run(agent="named", max_steps=5)
    def f() -> None:
        with guard.step() as step:
            step.model_call(model="gpt-4.1", input_tokens=10, output_tokens=2, response_id="r1")
            step.tool_call("search", {"q": 1}, result="ok", call_id="c1")
            step.progress(facts=["a"])
        guard.current_run().pause("p")
        guard.current_run().resume()
        guard.evidence("tests_passed")

    f()
    keys = {k for s in sink.spans for k in (s.attributes or {})}
    assert {semconv.RUN_ID, semconv.TOOL_CALL_ID, semconv.STATE_HASH} <= keys
    assert keys <= emitted, keys - emitted
    events = {e.name for s in sink.spans for e in s.events}
    assert events == {semconv.PAUSE_EVENT, semconv.RESUME_EVENT, semconv.EVIDENCE_EVENT}
