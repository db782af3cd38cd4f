"""The SDK's processor for third-party spans, in-process (guard.sdk._foreign), with a real guard.

Spans are written through the OpenTelemetry SDK by a tracer of another instrumentation, on the
provider the SDK is attached to, the way OpenLLMetry / OpenInference / Pydantic AI write them.
Checked: the run's own counters (so ``RunStopped.outcome`` and the record) and the guard's live
view of the run: one call counted once on both sides, whoever reported it and in what order.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from _live_view import live_view
from opentelemetry.trace import NoOpTracerProvider, SpanKind

import guard
from guard.policy import PolicyConfig
from guard.sdk._runtime import get_runtime
from guard.server import MemorySink
from guard.server._app import ServerThread
from guard.testing import SpanSink, capture_spans

CHAT = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4.1"}


@pytest.fixture
def guarded() -> Iterator[tuple[SpanSink, str]]:
    with (
        ServerThread(PolicyConfig.from_dict({}), sink=MemorySink()) as srv,
        capture_spans(endpoint=srv.address, hmac_key=b"k" * 16) as sink,
    ):
        yield sink, srv.address


def _usage(o: Any) -> tuple[int, int, int]:
    return (o.model_calls, o.input_tokens, o.output_tokens)


def test_an_aggregate_span_over_a_counted_call_is_not_counted_again(guarded: Any) -> None:
    sink, address = guarded
    tracer = sink.provider.get_tracer("pydantic-ai")
    box: dict[str, Any] = {}

    @guard.run(agent="agg")
    def agent() -> None:
        # Pydantic AI v1: an "agent run" span carrying the total of the chat call in it
        with guard.step(), tracer.start_as_current_span("agent run") as outer:
            attrs = {**CHAT, "gen_ai.usage.input_tokens": 500, "gen_ai.usage.output_tokens": 50}
            with tracer.start_as_current_span("chat gpt-4.1", attributes=attrs):
                pass
            outer.set_attributes({"gen_ai.usage.input_tokens": 500})
            outer.set_attribute("gen_ai.usage.output_tokens", 50)
        box["live"] = live_view(address, guard.current_run().run_id, 1)
        box["usage"] = _usage(guard.current_run().usage())

    agent()
    assert box["usage"] == (1, 500, 50)
    assert box["live"] == {"model_calls": 1, "tokens": 550}
    assert get_runtime().foreign.duplicates == 1


def test_a_call_recorded_before_its_instrumentation_span_ends_counts_once(guarded: Any) -> None:
    # An integration (or the user) records the call inside the instrumented call, before the
    # instrumentation's span ends; that span has no response id (OpenInference).
    sink, address = guarded
    tracer = sink.provider.get_tracer("openinference")
    box: dict[str, Any] = {}

    @guard.run(agent="order")
    def agent() -> None:
        for _ in range(2):
            with guard.step() as step, tracer.start_as_current_span("ChatCompletion") as s:
                s.set_attributes({"llm.token_count.prompt": 300, "llm.token_count.completion": 30})
                step.model_call(model="gpt-4.1", input_tokens=300, output_tokens=30)
        box["live"] = live_view(address, guard.current_run().run_id, 2)
        box["usage"] = _usage(guard.current_run().usage())

    agent()
    assert box["usage"] == (2, 600, 60)
    assert box["live"] == {"model_calls": 2, "tokens": 660}
    # the guard's copy of the instrumentation's span has no counters; the app's has them all
    chat = sink.named("ChatCompletion")
    assert len(chat) == 2 and all(s.attributes["llm.token_count.prompt"] == 300 for s in chat)


def test_a_different_call_in_the_same_step_still_counts(guarded: Any) -> None:
    sink, address = guarded
    tracer = sink.provider.get_tracer("openllmetry")
    box: dict[str, Any] = {}

    @guard.run(agent="two")
    def agent() -> None:
        with guard.step() as step:
            attrs = {**CHAT, "gen_ai.usage.input_tokens": 100, "gen_ai.usage.output_tokens": 10}
            with tracer.start_as_current_span("openai.chat", attributes=attrs):
                pass
            step.model_call(model="gpt-4.1", input_tokens=70, output_tokens=7)  # another call
        box["live"] = live_view(address, guard.current_run().run_id, 2)
        box["usage"] = _usage(guard.current_run().usage())

    agent()
    assert box["usage"] == (2, 170, 17)
    assert box["live"] == {"model_calls": 2, "tokens": 187}


def test_a_guard_tool_inside_a_framework_tool_span_counts_once() -> None:
    with capture_spans(hmac_key=b"k" * 16) as sink:
        tracer = sink.provider.get_tracer("pydantic-ai")

        @guard.tool
        def lookup(q: str) -> str:
            return "same"

        @guard.run(agent="tools", max_tool_calls=10)
        def agent() -> Any:
            for i in range(3):
                with guard.step():
                    attrs = {"gen_ai.tool.name": "lookup", "tool_arguments": f'{{"q": "{i}"}}'}
                    with tracer.start_as_current_span("running tool", attributes=attrs):
                        lookup(str(i))
            with guard.step():  # a framework tool without @guard.tool counts from its span
                attrs = {"gen_ai.tool.name": "fetch", "tool_arguments": '{"url": "x"}'}
                with tracer.start_as_current_span("running tool", attributes=attrs):
                    pass
            return guard.current_run().usage()

        usage = agent()
    assert usage.tool_calls == 4  # not 7, not 3


def test_parallel_and_nested_framework_tool_spans() -> None:
    with capture_spans(hmac_key=b"k" * 16) as sink:
        tracer = sink.provider.get_tracer("framework")

        @guard.run(agent="par")
        def agent() -> Any:
            with guard.step():
                # two calls of one tool in flight at once (a framework's parallel tool calls)
                a = tracer.start_span("running tool", attributes={"gen_ai.tool.name": "get"})
                b = tracer.start_span("running tool", attributes={"gen_ai.tool.name": "get"})
                a.set_attribute("tool_arguments", '{"id": 1}')
                b.set_attribute("tool_arguments", '{"id": 2}')
                a.end()
                b.end()
                # one call reported twice: a framework's tool span around an OpenInference one
                with tracer.start_as_current_span("execute_tool get") as outer:
                    outer.set_attribute("gen_ai.operation.name", "execute_tool")
                    attrs = {"openinference.span.kind": "TOOL", "tool.name": "get"}
                    with tracer.start_as_current_span("get", attributes=attrs):
                        pass
            return guard.current_run().usage()

        usage = agent()
    assert usage.tool_calls == 3


def test_framework_tool_spans_alone_stop_a_loop_with_varying_arguments() -> None:
    with capture_spans(hmac_key=b"k" * 16) as sink:
        tracer = sink.provider.get_tracer("pydantic-ai")
        calls = 0

        @guard.run(agent="loop", max_steps=50)
        def agent() -> None:
            nonlocal calls
            for i in range(40):
                with (
                    guard.step(),
                    tracer.start_as_current_span(
                        "execute_tool search",
                        kind=SpanKind.INTERNAL,
                        attributes={
                            "gen_ai.operation.name": "execute_tool",
                            "gen_ai.tool.name": "search",
                            "gen_ai.tool.call.arguments": f'{{"q": "refund", "page": {i}}}',
                            "gen_ai.tool.call.result": '{"hits": []}',
                        },
                    ),
                ):
                    calls += 1

        with pytest.raises(guard.RunStopped) as stop:
            agent()
    assert stop.value.outcome.reason.value == "loop_detected"
    assert stop.value.outcome.tool_calls == calls < 10
    exec_spans = [s for s in sink.named("execute_tool") if "guard.run.id" not in s.attributes]
    assert len(exec_spans) == calls  # the application's copies are untouched


def test_a_provider_of_another_kind_gets_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from guard.sdk import _providers

    monkeypatch.setattr(_providers, "_warned_provider", False)
    caplog.set_level(logging.WARNING, logger="guard.sdk")
    assert _providers.install_global_provider(NoOpTracerProvider()) is None
    assert _providers.install_global_provider(NoOpTracerProvider()) is None
    warnings = [r.getMessage() for r in caplog.records if "TracerProvider" in r.getMessage()]
    assert len(warnings) == 1
    assert "NoOpTracerProvider" in warnings[0] and "tracer_provider=" in warnings[0]


def test_reconfiguring_never_stacks_processors_on_a_provider() -> None:
    sink = SpanSink()
    for _ in range(3):
        guard.configure(tracer_provider=sink.provider)
        get_runtime()
    procs = sink.provider._active_span_processor._span_processors
    assert sum(type(p).__name__ == "_Relay" for p in procs) == 1
    guard.shutdown()
