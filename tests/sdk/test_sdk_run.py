"""@guard.run on sync, async and nested functions: values, outcomes, spans."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

import guard
from guard.errors import ConfigError
from guard.testing import SpanSink


def test_sync_run_returns_value_and_records_completion(sink: SpanSink) -> None:
    seen = {}

    @guard.run(agent="refund-bot", tenant="acme", max_steps=5)
    def handle(x: int) -> dict:
        r = guard.current_run()
        seen["run"] = r
        with guard.step() as step:
            step.model_call(model="gpt-4.1", input_tokens=1200, output_tokens=90)
            step.tool_call("search", {"q": "refund"}, result=["a"])
            step.progress(True)
        return {"answer": x}

    value = {"answer": 7}
    assert handle(7) == value
    run = seen["run"]
    o = run.outcome
    assert (o.status, o.reason, o.decided_by) == ("completed", "final_answer", "sdk")
    assert (o.steps, o.model_calls, o.tool_calls, o.input_tokens, o.output_tokens) == (
        1,
        1,
        1,
        1200,
        90,
    )
    assert o.cost_usd == pytest.approx((1200 * 2.0 + 90 * 8.0) / 1e6)
    assert o.tenant == "acme" and o.agent == "refund-bot" and o.last_tool == "search"
    assert o.partial_result is False and o.trace_id == run.trace_id and len(o.trace_id) == 32

    names = sink.names()
    assert names == ["chat gpt-4.1", "execute_tool search", "guard.step", "invoke_agent refund-bot"]
    model, tool, step_span, run_span = sink.spans
    assert step_span.parent.span_id == run_span.context.span_id
    assert model.parent.span_id == step_span.context.span_id
    assert tool.parent.span_id == step_span.context.span_id
    ra = dict(run_span.attributes)
    assert ra["gen_ai.operation.name"] == "invoke_agent" and ra["gen_ai.agent.name"] == "refund-bot"
    assert ra["guard.run.id"] == run.run_id and ra["guard.tenant"] == "acme"
    assert ra["guard.stop.status"] == "completed" and ra["guard.stop.reason"] == "final_answer"
    assert ra["guard.usage.steps"] == 1 and ra["guard.usage.tool_calls"] == 1
    assert ra["guard.cost.usd"] == pytest.approx(o.cost_usd)
    ma = dict(model.attributes)
    assert ma["gen_ai.operation.name"] == "chat" and ma["gen_ai.request.model"] == "gpt-4.1"
    assert ma["gen_ai.usage.input_tokens"] == 1200 and ma["gen_ai.usage.output_tokens"] == 90
    assert "gen_ai.usage.cache_read.input_tokens" in ma and "guard.cost.usd" in ma
    assert ma["gen_ai.provider.name"] == "openai"  # inferred from the model family
    ta = dict(tool.attributes)
    assert ta["gen_ai.tool.name"] == "search" and ta["gen_ai.operation.name"] == "execute_tool"
    assert len(ta["guard.action.fingerprint"]) == 32 and len(ta["guard.result.hash"]) == 32
    assert ta["guard.tool.attempts"] == 1
    sa = dict(step_span.attributes)
    assert sa["guard.step.index"] == 1 and sa["guard.progress"] is True
    assert sa["guard.action.fingerprint"] == ta["guard.action.fingerprint"]


async def test_async_run_returns_value(sink: SpanSink) -> None:
    @guard.run(agent="async-bot", max_steps=3)
    async def handle() -> str:
        async with guard.step() as step:
            await asyncio.sleep(0)
            step.model_call(model="unpriced-model", input_tokens=10, output_tokens=1)
        return "ok"

    assert await handle() == "ok"
    run_span = sink.named("invoke_agent")[0]
    assert run_span.attributes["guard.stop.status"] == "completed"
    assert "guard.cost.usd" not in run_span.attributes  # unpriced: unknown, never 0


def test_unpriced_model_cost_is_none_and_explicit_cost_wins(sink: SpanSink) -> None:
    out = {}

    @guard.run(agent="a")
    def handle() -> None:
        with guard.step() as step:
            out["none"] = step.model_call(model="mystery-9", input_tokens=5, output_tokens=5)
            out["given"] = step.model_call(model="mystery-9", input_tokens=5, cost_usd=0.02)
        out["run"] = guard.current_run()

    handle()
    assert out["none"] is None and out["given"] == 0.02
    assert out["run"].outcome.cost_usd == pytest.approx(0.02)


def test_nested_run_gets_parent_and_counts_against_parent_budget(sink: SpanSink) -> None:
    runs = {}

    @guard.run(agent="child", max_tokens=10_000)
    def child() -> str:
        runs["child"] = guard.current_run()
        with guard.step() as step:
            step.model_call(model="gpt-4.1", input_tokens=600, output_tokens=0)
        return "sub"

    @guard.run(agent="parent", max_tokens=1000)
    def parent() -> str:
        runs["parent"] = guard.current_run()
        child()
        with guard.step() as step:  # the child's 600 tokens count here too
            step.model_call(model="gpt-4.1", input_tokens=500, output_tokens=0)
        with guard.step():
            pass
        return "never"

    with pytest.raises(guard.RunStopped) as stop:
        parent()
    c, p = runs["child"].outcome, stop.value.outcome
    assert c.parent_run_id == p.run_id and c.status == "completed"
    assert p.reason == "token_budget" and p.input_tokens == 1100
    assert sink.named("invoke_agent child")[0].attributes["guard.parent_run.id"] == p.run_id
    assert sink.named("invoke_agent child")[0].context.trace_id == (
        sink.named("invoke_agent parent")[0].context.trace_id
    )


async def test_nested_async_child_stop_caused_by_parent_budget(sink: SpanSink) -> None:
    @guard.run(agent="child", max_steps=100)
    async def child() -> None:
        while True:
            async with guard.step():
                await asyncio.sleep(0)

    @guard.run(agent="parent", max_steps=3)
    async def parent() -> None:
        await child()

    with pytest.raises(guard.RunStopped) as stop:
        await parent()
    o = stop.value.outcome
    assert o.reason == "max_steps" and o.agent == "parent" and o.steps == 3


def test_outcome_fields_on_stop(sink: SpanSink) -> None:
    @guard.run(agent="bot", max_steps=2, deadline_s=60)
    def handle() -> None:
        while True:
            with guard.step() as step:
                step.model_call(
                    model="gpt-4.1",
                    input_tokens=100,
                    output_tokens=10,
                    reasoning_tokens=4,
                    cached_tokens=20,
                )
                step.tool_call("lookup", {"id": 1}, result={"ok": True}, attempts=2)

    with pytest.raises(guard.RunStopped) as stop:
        handle()
    o = stop.value.outcome
    fields = {f.name for f in dataclasses.fields(o)}
    for name in (
        "status",
        "reason",
        "steps",
        "model_calls",
        "tool_calls",
        "tool_attempts",
        "input_tokens",
        "output_tokens",
        "reasoning_tokens",
        "cached_tokens",
        "cost_usd",
        "elapsed_ms",
        "deadline_ms",
        "last_tool",
        "last_action_hash",
        "loop_hits",
        "recoverable",
        "partial_result",
    ):
        assert name in fields
    assert (o.status, o.reason) == ("terminated", "max_steps")
    assert "max_steps 2 reached (steps=2)" in o.message
    assert (o.steps, o.model_calls, o.tool_calls, o.tool_attempts) == (2, 2, 2, 4)
    assert (o.input_tokens, o.output_tokens, o.reasoning_tokens, o.cached_tokens) == (
        200,
        20,
        8,
        40,
    )
    assert o.cost_usd > 0 and o.deadline_ms == 60_000 and o.elapsed_ms >= 0
    assert o.last_tool == "lookup" and len(o.last_action_hash) == 32
    assert o.partial_result is True and o.recoverable is True and o.loop_hits >= 0
    assert str(stop.value) == o.message


def test_exception_in_user_code_is_failed_error_and_propagates(sink: SpanSink) -> None:
    seen = {}

    @guard.run(agent="bot")
    def handle() -> None:
        seen["run"] = guard.current_run()
        raise KeyError("secret-customer-id")

    with pytest.raises(KeyError):
        handle()
    o = seen["run"].outcome
    assert (o.status, o.reason) == ("failed", "error")
    assert "secret-customer-id" not in o.message  # no raw text in the record


def test_bad_decorator_arguments_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        guard.run(max_steps=-1)(lambda: None)
    with pytest.raises(ConfigError, match="preset"):
        guard.run(preset="no-such-preset")(lambda: None)
    with pytest.raises(TypeError):
        guard.run(max_stepz=3)(lambda: None)  # type: ignore[call-arg]


def test_preset_applies_and_decorator_tightens(sink: SpanSink) -> None:
    seen = {}

    @guard.run(agent="faq", preset="faq", max_steps=2)
    def handle() -> None:
        seen["limits"] = guard.current_run().limits

    handle()
    assert seen["limits"].max_steps == 2 and seen["limits"].max_tool_calls == 4


def test_step_and_tools_outside_a_run_are_harmless() -> None:
    @guard.tool
    def add(a: int, b: int) -> int:
        return a + b

    with guard.step() as step:
        step.model_call(model="gpt-4.1", input_tokens=1)
        step.tool_call("x", {"a": 1})
        step.progress(True)
    assert add(1, 2) == 3
    r = guard.current_run()
    assert not r and r.timeout(3.0) == 3.0 and r.remaining().steps is None
