"""No content of any instrumentation reaches the guard, its logs or its store (DESIGN §3.3).

Spans written the way OpenLLMetry (content capture on), OpenInference, OpenLIT and Pydantic AI
write them, with unique markers as content, go through the application's own
TracerProvider inside a real ``@guard.run``. Every byte the guard receives and answers is
recorded by a real gRPC proxy in front of a real guard (with the embedded ClickHouse store).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from _genai_spans import M, contains_marker, emit_instrumented_calls
from _recording_proxy import RecordingProxy
from _wait import wait_until
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import guard
from guard.cli._client import AdminClient
from guard.policy import PolicyConfig
from guard.semconv import is_content_attribute
from guard.server._app import ServerThread
from guard.v1 import guard_pb2 as pb

pytest.importorskip("guard.store")

TENANT = "acme"
POLICY = {
    "tenants": {TENANT: {"rolling": [{"metric": "tokens", "limit": 10**9, "window_s": 3600}]}},
    # each instrumentation reports a get_weather call with the same arguments and result
    # (emit_instrumented_calls): counted as tool calls, they are no loop in these tests
    "runs": {"loop": {"repeat_threshold": 10}},
}


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

        # the same repeats, for the SDK's own loop detection (see POLICY)
        @guard.run(agent="weather", loop={"repeat_threshold": 10})
        def agent() -> str:
            box["run_id"] = guard.current_run().run_id
            with guard.step():
                box["made"], box["tokens"] = emit_instrumented_calls(tracer)
            assert guard.flush(10)
            # the guard counts the foreign calls' tokens (read by the test once the run is over)
            wait_until(lambda: _tenant_tokens(srv.address) >= box["tokens"], 10, "the tokens")
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

    # hello, two RunStarted and two RunEnded went through it too (some may share a batch)
    frames = [pb.AgentMessage.FromString(b) for b in control]
    sent = [m for f in frames for m in (f.batch.messages if f.HasField("batch") else [f])]
    assert len(sent) >= 5

    # the guard received the spans and their counters, and counted each model call once
    assert box["counted"] == box["tokens"]
    assert b"llm.token_count.prompt" in otlp and b"gen_ai.usage.prompt_tokens" in otlp
    # ... but no content: not on the wire, in the guard's logs, or in its store
    assert contains_marker(wire) == []
    assert b"get_weather" in otlp and b"gen_ai.content.prompt" not in otlp  # event dropped
    assert store.flush(10)
    dump = _store_dump(store)
    assert box["run_id"] in dump  # the run's record is there
    assert contains_marker(dump) == []
    assert contains_marker(_files_dump(data)) == []
    assert contains_marker("\n".join(r.getMessage() for r in caplog.records)) == []
    out, err = capfd.readouterr()
    assert contains_marker(out + err) == []
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
            made, tokens = emit_instrumented_calls(tracer)
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

    assert len(contains_marker(received)) >= 6  # the content did reach the guard
    assert b"rejected" in answered or b"out of range" in answered  # the refused span
    assert contains_marker(answered) == []
    assert contains_marker(err.value.details() or "") == []
    assert store.flush(10)
    rows = store.query(
        f"SELECT input_tokens + output_tokens FROM otel_guard.runs FINAL WHERE run_id = '{run_id}'"
    )
    assert rows == [(tokens,)]  # counted from the foreign spans
    assert contains_marker(_store_dump(store)) == []
    assert contains_marker(_files_dump(data)) == []
    assert contains_marker("\n".join(r.getMessage() for r in caplog.records)) == []
    out, err_text = capfd.readouterr()
    assert contains_marker(out + err_text) == []
    # every attribute given a marker above is in the content table
    marked = [k for _, attrs in made for k, v in attrs.items() if contains_marker(str(v))]
    assert len(marked) >= 30 and all(map(is_content_attribute, marked))
