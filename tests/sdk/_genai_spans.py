"""Spans written the way other GenAI instrumentations write them, with markers as content.

One model call (and tools) per instrumentation: OpenLLMetry with content capture on,
OpenInference, OpenLIT, Pydantic AI (instrumentation v3+ and v1/Logfire). Attribute and event
names are theirs; every piece of content is one of the unique strings of ``M``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind

M = {  # unique content markers, one per kind of content
    "system": "SECRET-SYSTEM-7f3a",
    "prompt": "SECRET-PROMPT-19be",
    "args": "SECRET-ARGS-c0de",
    "result": "SECRET-RESULT-55d0",
    "answer": "SECRET-ANSWER-e2e2",
    "doc": "SECRET-DOC-aa11",
    "error": "SECRET-ERROR-0b1e",
}
MARKERS = tuple(M.values())


def emit_instrumented_calls(tracer: trace.Tracer) -> tuple[list[tuple[str, dict[str, Any]]], int]:
    """Emit one model call (and tools) per instrumentation in the current context.

    Returns the ``(span name, attributes)`` set on each span, and the tokens the guard must
    count: one per model call, however many spans report it.
    """
    made: list[tuple[str, dict[str, Any]]] = []

    def emit(name: str, attrs: dict[str, Any], events=(), kind=SpanKind.CLIENT, error=False):
        with tracer.start_as_current_span(name, kind=kind, attributes=attrs) as s:
            for ev_name, ev_attrs in events:
                s.add_event(ev_name, ev_attrs)
            made.append((name, attrs))
            if error:  # start_as_current_span records it: an exception event + status text
                raise ValueError(M["error"])
        return s

    # OpenLLMetry with TRACELOOP_TRACE_CONTENT on (indexed prompt/completion attributes)
    emit(
        "openai.chat",
        {
            "gen_ai.system": "openai",
            "llm.request.type": "chat",
            "gen_ai.request.model": "gpt-4o-mini",
            "gen_ai.usage.prompt_tokens": 101,
            "gen_ai.usage.completion_tokens": 11,
            "gen_ai.prompt.0.role": "system",
            "gen_ai.prompt.0.content": M["system"],
            "gen_ai.prompt.1.role": "user",
            "gen_ai.prompt.1.content": M["prompt"],
            "gen_ai.completion.0.content": M["answer"],
            "gen_ai.completion.0.tool_calls.0.arguments": M["args"],
            "llm.request.functions.0.description": M["system"],
        },
    )
    emit(
        "get_weather.tool",
        {
            "traceloop.span.kind": "tool",
            "traceloop.entity.name": "get_weather",
            "traceloop.entity.input": json.dumps({"city": M["args"]}),
            "traceloop.entity.output": M["result"],
        },
        kind=SpanKind.INTERNAL,
    )
    # OpenInference (default: content on)
    emit(
        "ChatCompletion",
        {
            "openinference.span.kind": "LLM",
            "llm.model_name": "gpt-4o-mini",
            "llm.token_count.prompt": 202,
            "llm.token_count.completion": 22,
            "llm.token_count.total": 224,
            "input.value": json.dumps({"messages": M["prompt"]}),
            "input.mime_type": "application/json",
            "output.value": M["answer"],
            "llm.input_messages.0.message.role": "system",
            "llm.input_messages.0.message.content": M["system"],
            "llm.input_messages.1.message.contents.0.message_content.text": M["prompt"],
            "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": M["args"],
            "llm.invocation_parameters": json.dumps({"system": M["system"]}),
            "llm.tools.0.tool.json_schema": M["system"],
        },
    )
    emit(
        "get_weather",
        {
            "openinference.span.kind": "TOOL",
            "tool.name": "get_weather",
            "tool.parameters": M["args"],
            "input.value": M["args"],
            "output.value": M["result"],
        },
        kind=SpanKind.INTERNAL,
    )
    emit(
        "retrieve",
        {
            "openinference.span.kind": "RETRIEVER",
            "input.value": M["prompt"],
            "retrieval.documents.0.document.content": M["doc"],
            "retrieval.documents.0.document.id": "doc-1",
        },
        kind=SpanKind.INTERNAL,
    )
    # OpenLIT (content as span events, and on the span in older versions)
    emit(
        "chat gpt-4o-mini",
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.system": "openai",
            "gen_ai.request.model": "gpt-4o-mini",
            "gen_ai.usage.input_tokens": 303,
            "gen_ai.usage.output_tokens": 33,
            "gen_ai.usage.cost": 0.0001,
            "gen_ai.tool.args": M["args"],
        },
        events=[
            ("gen_ai.content.prompt", {"gen_ai.prompt": M["prompt"]}),
            ("gen_ai.content.completion", {"gen_ai.completion": M["answer"]}),
        ],
    )
    # Pydantic AI, instrumentation v3+ (current semconv names) with include_content
    emit(
        "chat gpt-4o",
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": "gpt-4o",
            "gen_ai.usage.input_tokens": 404,
            "gen_ai.usage.output_tokens": 44,
            "gen_ai.response.id": "resp-pyd-1",
            "gen_ai.system_instructions": json.dumps([{"type": "text", "content": M["system"]}]),
            "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [M["prompt"]]}]),
            "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [M["answer"]]}]),
            "gen_ai.tool.definitions": json.dumps([{"description": M["system"]}]),
            "logfire.msg": "chat gpt-4o",
        },
        events=[
            ("gen_ai.client.inference.operation.details", {"gen_ai.input.messages": M["prompt"]}),
            ("gen_ai.user.message", {"content": M["prompt"]}),
            ("gen_ai.choice", {"message": M["answer"]}),
        ],
    )
    emit(
        "execute_tool get_weather",
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "get_weather",
            "gen_ai.tool.call.id": "call-1",
            "gen_ai.tool.call.arguments": M["args"],
            "gen_ai.tool.call.result": M["result"],
        },
        kind=SpanKind.INTERNAL,
    )
    # Pydantic AI, instrumentation v1 (Logfire): an agent run span aggregating its chat call
    with tracer.start_as_current_span("agent run", kind=SpanKind.INTERNAL) as run_span:
        emit(
            "chat gpt-4o",
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.system": "openai",
                "gen_ai.request.model": "gpt-4o",
                "gen_ai.usage.input_tokens": 505,
                "gen_ai.usage.output_tokens": 55,
                "events": json.dumps(
                    [{"event.name": "gen_ai.user.message", "content": M["prompt"]}]
                ),
            },
        )
        emit(
            "running tool",
            {
                "gen_ai.tool.name": "get_weather",
                "tool_arguments": M["args"],
                "tool_response": M["result"],
            },
            kind=SpanKind.INTERNAL,
        )
        with pytest.raises(ValueError):
            emit("running tool", {"gen_ai.tool.name": "broken"}, kind=SpanKind.INTERNAL, error=True)
        agg = {
            "agent_name": "weather",
            "gen_ai.usage.input_tokens": 505,
            "gen_ai.usage.output_tokens": 55,
            "all_messages_events": json.dumps([{"content": M["prompt"]}]),
            "final_result": M["answer"],
        }
        run_span.set_attributes(agg)
    made.append(("agent run", agg))
    return made, (101 + 11) + (202 + 22) + (303 + 33) + (404 + 44) + (505 + 55)


def contains_marker(data: bytes | str) -> list[str]:
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return [m for m in MARKERS if m in text]
