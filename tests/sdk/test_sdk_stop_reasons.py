"""Every stop reason the SDK produces locally (no guard): one runaway pattern each."""

from __future__ import annotations

import asyncio
import time

import pytest

import guard
from guard.policy import Limits
from guard.sdk._clock import ManualClock
from guard.testing import FakeModel, Reply, SpanSink, ToolCall, run_agent_loop


def _stop(fn, *args):
    with pytest.raises(guard.RunStopped) as info:
        fn(*args)
    return info.value.outcome


def test_max_steps(sink: SpanSink) -> None:
    @guard.run(agent="a", max_steps=3)
    def f() -> None:
        while True:
            with guard.step():
                pass

    o = _stop(f)
    assert (o.status, o.reason, o.steps) == ("terminated", "max_steps", 3)
    assert sink.names().count("guard.step") == 3


def test_max_model_calls_is_a_step_limit(sink: SpanSink) -> None:
    @guard.run(agent="a", max_model_calls=2)
    def f() -> None:
        while True:
            with guard.step() as s:
                s.model_call(model="m", input_tokens=1)

    o = _stop(f)
    assert o.reason == "max_steps" and o.model_calls == 2  # no room for a third


def test_max_tool_calls_refuses_the_call_before_it_runs(sink: SpanSink) -> None:
    ran = []

    @guard.tool
    def act(i: int) -> int:
        ran.append(i)
        return i

    @guard.run(agent="a", max_tool_calls=3)
    def f() -> None:
        for i in range(10):
            act(i)

    o = _stop(f)
    assert (o.status, o.reason, o.tool_calls) == ("terminated", "max_tool_calls", 3)
    assert ran == [0, 1, 2]


@pytest.mark.parametrize("implicit", [True, False])
def test_token_budget(sink: SpanSink, implicit: bool) -> None:
    @guard.run(agent="a", max_tokens=1000, limits=Limits(implicit_estimates=implicit))
    def f() -> None:
        while True:
            with guard.step() as s:
                s.model_call(model="gpt-4.1", input_tokens=400, output_tokens=10)

    o = _stop(f)
    assert (o.reason, o.steps) == ("token_budget", 3)
    if implicit:  # the third step's estimate (the mean, 410 tokens) does not fit: no call
        assert o.model_calls == 2 and "implicit estimate" in o.message, o.message
        assert "410 tokens" in o.message and "available 180" in o.message, o.message
    else:  # recorded after the fact: the third call passes the limit, the run stops after it
        assert o.model_calls == 3 and "max_tokens 1000 reached" in o.message


@pytest.mark.parametrize("implicit", [True, False])
def test_cost_budget(sink: SpanSink, implicit: bool) -> None:
    @guard.run(agent="a", max_cost_usd=0.01, limits=Limits(implicit_estimates=implicit))
    def f() -> None:
        while True:
            with guard.step() as s:
                s.model_call(model="gpt-4.1", input_tokens=2000, output_tokens=0)  # $0.004

    o = _stop(f)
    assert o.reason == "cost_budget" and o.steps == 3
    if implicit:  # 0.008 + the mean 0.004 would pass 0.01: the third call never starts
        assert o.cost_usd == pytest.approx(0.008) and "implicit estimate" in o.message
    else:
        assert o.cost_usd >= 0.01


def test_completion_wins_over_budget_reached_in_the_same_step(sink: SpanSink) -> None:
    @guard.run(agent="a", max_tokens=1000)
    def f() -> str:
        with guard.step() as s:
            s.model_call(model="gpt-4.1", input_tokens=990, output_tokens=10)  # reaches it
        return "final"

    assert f() == "final"
    assert sink.named("invoke_agent")[0].attributes["guard.stop.reason"] == "final_answer"


def test_deadline_stops_a_sync_run_at_the_next_sdk_call(
    clocked_sink: SpanSink, clock: ManualClock
) -> None:
    @guard.run(agent="a", deadline_s=0.25)
    def f() -> None:
        while True:
            with guard.step():
                clock.advance(0.0625)  # each step takes 62.5 ms of the run's clock (exact floats)

    o = _stop(f)
    assert (o.status, o.reason) == ("terminated", "deadline")
    assert o.deadline_ms == 250
    assert o.steps == 4  # the deadline passed during the 4th step; the 5th is refused


async def test_deadline_interrupts_an_awaiting_async_run(
    clocked_sink: SpanSink, clock: ManualClock
) -> None:
    awaiting = asyncio.Event()

    @guard.run(agent="a", deadline_s=0.25)
    async def f() -> None:
        async with guard.step():
            awaiting.set()
            await asyncio.sleep(30)  # a hung model call

    task = asyncio.ensure_future(f())
    await asyncio.wait_for(awaiting.wait(), 10)
    clock.advance(0.125)
    await asyncio.sleep(0)
    assert not task.done()  # before the deadline nothing happens
    clock.advance(0.125)  # the deadline: the SDK cancels the awaiting task
    with pytest.raises(guard.RunStopped) as info:
        await asyncio.wait_for(task, 10)
    assert info.value.outcome.reason == "deadline"


async def test_loop_detected_with_no_guard(sink: SpanSink) -> None:
    model = FakeModel.looping(ToolCall("search", {"q": "refund policy"}))

    @guard.run(agent="looper", max_steps=50)
    async def f() -> str:
        return await run_agent_loop(model, {"search": lambda q: "no results"})

    with pytest.raises(guard.RunStopped) as info:
        await f()
    o = info.value.outcome
    assert (o.status, o.reason) == ("terminated", "loop_detected")
    assert o.steps < 10 and o.loop_hits >= 1 and o.recoverable is False


def test_no_progress(sink: SpanSink) -> None:
    @guard.run(agent="a", max_steps=100, loop={"no_progress_steps": 3})
    def f() -> None:
        i = 0
        while True:
            with guard.step() as s:
                i += 1
                s.tool_call("read", {"page": i, "file": f"f{i}"}, result=i)
                s.progress(facts=["same", "state"])

    o = _stop(f)
    assert o.reason == "no_progress" and o.steps <= 5


def test_missing_evidence_is_degraded(sink: SpanSink) -> None:
    @guard.run(agent="fixer", require_evidence=["tests_passed"])
    def claims_done() -> str:
        return "fixed it!"

    @guard.run(agent="fixer", require_evidence=["tests_passed"])
    def proves_done() -> str:
        guard.evidence("tests_passed", ok=True)
        return "fixed it!"

    @guard.run(agent="fixer", require_evidence=["tests_passed"])
    def failed_tests() -> str:
        guard.evidence("tests_passed", ok=False)
        return "fixed it?"

    assert claims_done() == "fixed it!"  # value unchanged; the record says degraded
    assert proves_done() == "fixed it!"
    assert failed_tests() == "fixed it?"
    reasons = [
        (s.attributes["guard.stop.status"], s.attributes["guard.stop.reason"])
        for s in sink.named("invoke_agent")
    ]
    assert reasons == [
        ("degraded", "missing_evidence"),
        ("completed", "final_answer"),
        ("degraded", "missing_evidence"),
    ]


def test_tool_error_from_guard_tool(sink: SpanSink) -> None:
    @guard.tool(retries=1)
    def flaky() -> None:
        raise ConnectionError("db down at 10.0.0.5")

    seen = {}

    @guard.run(agent="a")
    def f() -> None:
        seen["run"] = guard.current_run()
        with guard.step():
            flaky()

    with pytest.raises(ConnectionError):
        f()
    o = seen["run"].outcome
    assert (o.status, o.reason, o.tool_calls, o.tool_attempts) == ("failed", "tool_error", 1, 2)
    tool_span = sink.named("execute_tool flaky")[0]
    assert tool_span.attributes["error.type"] == "ConnectionError"
    assert "10.0.0.5" not in sink.dump()


def test_model_error(sink: SpanSink) -> None:
    seen = {}

    class RateLimitError(Exception):
        pass

    @guard.run(agent="a")
    def f() -> None:
        seen["run"] = guard.current_run()
        with guard.step() as s:
            try:
                raise RateLimitError("429")
            except RateLimitError as exc:
                s.model_call(model="gpt-4.1", error=exc)
                raise

    with pytest.raises(RateLimitError):
        f()
    o = seen["run"].outcome
    assert (o.status, o.reason, o.recoverable) == ("failed", "model_error", True)


def test_user_and_operator_cancel(sink: SpanSink) -> None:
    @guard.run(agent="a")
    def f(reason: str) -> None:
        guard.current_run().cancel(reason)
        with guard.step():
            pass

    assert (_stop(f, "user_cancel").status, _stop(f, "user_cancel").reason) == (
        "cancelled",
        "user_cancel",
    )
    o = _stop(f, "operator_cancel")
    assert (o.reason, o.decided_by) == ("operator_cancel", "operator")
    o = _stop(f, "user pressed stop")  # free text -> user_cancel with the text as detail
    assert o.reason == "user_cancel" and "user pressed stop" in o.message


def test_caught_stop_and_returned_summary_keeps_the_stop_reason(sink: SpanSink) -> None:
    @guard.run(agent="a", max_steps=1)
    def f() -> str:
        try:
            while True:
                with guard.step():
                    pass
        except guard.RunStopped:
            return "summary of what I found"

    assert f() == "summary of what I found"
    attrs = sink.named("invoke_agent")[0].attributes
    assert attrs["guard.stop.reason"] == "max_steps"


async def test_parallel_batch_overflow_gets_error_results(sink: SpanSink) -> None:
    calls = [{"id": f"c{i}", "q": i} for i in range(5)]

    @guard.run(agent="a", max_tool_calls=3)
    async def f() -> list:
        async with guard.step() as s:

            async def one(call: dict) -> str:
                await asyncio.sleep(0.01)
                s.tool_call("search", {"q": call["q"]}, result="r", call_id=call["id"])
                return f"result {call['id']}"

            return await guard.run_tools(calls, one)

    results = await f()
    assert results[:3] == ["result c0", "result c1", "result c2"]
    assert [r["tool_call_id"] for r in results[3:]] == ["c3", "c4"]
    assert all(r["is_error"] and "max_tool_calls" in r["content"] for r in results[3:])
    assert sink.named("invoke_agent")[0].attributes["guard.usage.tool_calls"] == 3


def test_sync_reply_script_helpers_work(sink: SpanSink) -> None:
    model = FakeModel([Reply(tool_calls=(ToolCall("a", {"x": 1}),)), Reply(text="bye")])
    assert model.complete().tool_calls[0].id == "call_1"
    assert model.complete().text == "bye" and model.complete().text == "bye"


def test_concurrent_tool_calls_never_oversell_the_quota(sink: SpanSink) -> None:
    import threading

    ran: list[int] = []
    stops: list[str] = []

    @guard.tool
    def work(i: int) -> int:
        time.sleep(0.002)
        ran.append(i)
        return i

    @guard.run(agent="a", max_tool_calls=10)
    def f() -> None:
        import contextvars

        def worker(i: int) -> None:
            try:
                work(i)
            except guard.RunStopped as exc:
                stops.append(exc.outcome.reason)

        threads = [
            threading.Thread(target=contextvars.copy_context().run, args=(worker, i))
            for i in range(32)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    f()  # the workers caught their stops: the run returns, recorded as stopped
    assert len(ran) == 10 and len(stops) == 22 and set(stops) == {"max_tool_calls"}
    attrs = sink.named("invoke_agent")[0].attributes
    assert attrs["guard.stop.reason"] == "max_tool_calls" and attrs["guard.usage.tool_calls"] == 10
