"""No content of any instrumentation reaches the guard, its logs or its store (DESIGN §3.3).

Spans written the way OpenLLMetry (content capture on), OpenInference, OpenLIT and Pydantic AI
write them, with unique markers as content, go through the application's own
TracerProvider inside a real ``@guard.run``. Every byte the guard receives and answers is
recorded by a real gRPC proxy in front of a real guard (with the embedded ClickHouse store).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from _recording_proxy import RecordingProxy
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import guard
from guard.cli._client import AdminClient
from guard.policy import PolicyConfig
from guard.semconv import is_content_attribute
from guard.server._app import ServerThread

pytest.importorskip("guard.store")

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
TENANT = "acme"
POLICY = {
    "tenants": {TENANT: {"rolling": [{"metric": "tokens", "limit": 10**9, "window_s": 3600}]}}
}


def _calls(tracer: trace.Tracer) -> tuple[list[tuple[str, dict[str, Any]]], int]:
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


def _contains_marker(data: bytes | str) -> list[str]:
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return [m for m in MARKERS if m in text]


def _store_dump(store: Any) -> str:
    """Every row of every table of the store, as text (aggregate states excepted: numbers)."""
    cols = store.query(
        "SELECT table, name FROM system.columns WHERE database = 'otel_guard' "
        "AND type NOT LIKE '%AggregateFunction%' AND table NOT LIKE '%_mv' ORDER BY table"
    )
    tables: dict[str, list[str]] = {}
    for table, name in cols:
        tables.setdefault(table, []).append(f"toString(`{name}`)")
    return "\n".join(
        repr(store.query(f"SELECT {', '.join(c)} FROM otel_guard.`{t}`")) for t, c in tables.items()
    )


def _files_dump(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in root.rglob("*") if p.is_file())


def _tenant_tokens(address: str) -> float:
    with AdminClient(address) as c:
        for t in c.tenant_budgets(TENANT).tenants:
            for w in t.windows:
                if w.metric == "tokens":
                    return w.used
    return 0.0


@pytest.fixture
def guard_with_store(tmp_path: Path) -> Iterator[tuple[ServerThread, Any, Path]]:
    from guard.store import open_store

    data = tmp_path / "store"
    store = open_store(None, data_dir=data, flush_interval_s=0.05)
    try:
        with ServerThread(PolicyConfig.from_dict(POLICY), sink=store) as srv:
            yield srv, store, data
    finally:
        store.close()


def test_no_content_reaches_the_guard_its_logs_or_its_store(
    guard_with_store: tuple[ServerThread, Any, Path],
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    srv, store, data = guard_with_store
    app_spans = InMemorySpanExporter()
    provider = TracerProvider()  # the application's own pipeline
    provider.add_span_processor(SimpleSpanProcessor(app_spans))
    tracer = provider.get_tracer("third-party-instrumentation")
    with RecordingProxy(srv.address) as proxy:
        guard.configure(endpoint=proxy.address, tenant=TENANT, tracer_provider=provider)
        box: dict[str, Any] = {}

        @guard.run(agent="weather")
        def agent() -> str:
            box["run_id"] = guard.current_run().run_id
            with guard.step():
                box["made"], box["tokens"] = _calls(tracer)
            assert guard.flush(10)
            deadline = time.monotonic() + 10  # the guard counts the foreign calls' tokens
            while _tenant_tokens(srv.address) < box["tokens"] and time.monotonic() < deadline:
                time.sleep(0.02)
            box["counted"] = _tenant_tokens(srv.address)
            return "done"

        assert agent() == "done"

        @guard.run(agent="weather")
        def broken() -> None:  # its RunEnded on the control stream says why, not the text
            raise ValueError(M["error"])

        with pytest.raises(ValueError):
            broken()
        stats = guard.stats()
        guard.shutdown()
        wire = proxy.all_bytes()
        otlp = b"".join(proxy.bodies("TraceService/Export"))
        control = proxy.bodies("GuardControl/Attach")

    assert len(control) >= 5  # hello, two RunStarted and two RunEnded went through it too

    # the guard received the spans and their counters, and counted each model call once
    assert box["counted"] == box["tokens"]
    assert b"llm.token_count.prompt" in otlp and b"gen_ai.usage.prompt_tokens" in otlp
    # ... but no content: not on the wire, in the guard's logs, or in its store
    assert _contains_marker(wire) == []
    assert b"get_weather" in otlp and b"gen_ai.content.prompt" not in otlp  # event dropped
    assert store.flush(10)
    dump = _store_dump(store)
    assert box["run_id"] in dump  # the run's record is there
    assert _contains_marker(dump) == []
    assert _contains_marker(_files_dump(data)) == []
    assert _contains_marker("\n".join(r.getMessage() for r in caplog.records)) == []
    out, err = capfd.readouterr()
    assert _contains_marker(out + err) == []
    # what was removed is counted
    assert stats["redacted_spans"] == len(box["made"])  # each of them carried content
    assert stats["redacted_events"] == 5
    # content attributes, plus the exception event's message and stack trace and the error
    # status description of the span that raised
    content = sum(is_content_attribute(k) for _, attrs in box["made"] for k in attrs)
    assert stats["redacted_attributes"] == content + 3
    # the application's own exporter saw every attribute and event unchanged
    seen = [(s.name, dict(s.attributes or {})) for s in app_spans.get_finished_spans()]
    for made in box["made"]:
        assert made in seen
    events = [e for s in app_spans.get_finished_spans() for e in s.events]
    assert {e.name for e in events} >= {"gen_ai.content.prompt", "gen_ai.choice", "exception"}
    assert M["error"] in [
        e.attributes["exception.message"] for e in events if e.name == "exception"
    ]
    provider.shutdown()


def test_the_guard_never_echoes_or_stores_content_it_receives(
    guard_with_store: tuple[ServerThread, Any, Path],
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """An application (or a collector) exporting content straight to the guard, bypassing the
    SDK: the guard reads none of it, and no answer, log line or row repeats it, even for a
    span it refuses or a request it cannot parse."""
    caplog.set_level(logging.DEBUG)
    srv, store, data = guard_with_store
    with RecordingProxy(srv.address) as proxy:
        provider = TracerProvider()
        provider.add_span_processor(
            SimpleSpanProcessor(OTLPSpanExporter(endpoint=proxy.address, insecure=True))
        )
        tracer = provider.get_tracer("plain-otel")
        run_id = "run-redaction-direct"
        ours = {"guard.run.id": run_id, "guard.tenant": TENANT}
        with tracer.start_as_current_span("invoke_agent weather") as run_span:
            run_span.set_attributes({**ours, "gen_ai.operation.name": "invoke_agent"})
            with tracer.start_as_current_span("guard.step", attributes=ours):
                pass  # the guard learns the run (and its trace) from its first span
            made, tokens = _calls(tracer)
            # a span the guard refuses (negative counter), carrying content
            with tracer.start_as_current_span(
                "openai.chat",
                attributes={"gen_ai.usage.input_tokens": -5, "input.value": M["prompt"]},
            ):
                pass
            run_span.set_attributes({"guard.stop.status": "completed"})
        provider.shutdown()
        # a request the guard cannot parse: invalid UTF-8 inside a content attribute
        good = next(b for b in proxy.bodies("Export") if M["prompt"].encode() in b)
        bad = good.replace(M["prompt"].encode(), b"SECRET-\xff")
        method = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
        with grpc.insecure_channel(proxy.address) as ch, pytest.raises(grpc.RpcError) as err:
            ch.unary_unary(method)(bad, timeout=10)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        received = b"".join(proxy.bodies())
        answered = b"".join(b for _, b in proxy.sent)

    assert len(_contains_marker(received)) >= 6  # the content did reach the guard
    assert b"rejected" in answered or b"out of range" in answered  # the refused span
    assert _contains_marker(answered) == []
    assert _contains_marker(err.value.details() or "") == []
    assert store.flush(10)
    rows = store.query(
        f"SELECT input_tokens + output_tokens FROM otel_guard.runs FINAL WHERE run_id = '{run_id}'"
    )
    assert rows == [(tokens,)]  # counted from the foreign spans
    assert _contains_marker(_store_dump(store)) == []
    assert _contains_marker(_files_dump(data)) == []
    assert _contains_marker("\n".join(r.getMessage() for r in caplog.records)) == []
    out, err_text = capfd.readouterr()
    assert _contains_marker(out + err_text) == []
    # every attribute given a marker above is in the content table
    marked = [k for _, attrs in made for k, v in attrs.items() if _contains_marker(str(v))]
    assert len(marked) >= 30 and all(map(is_content_attribute, marked))
