"""Spans reach the application's TracerProvider and, through the real OTLP exporter, a guard."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from concurrent import futures

import grpc
import pytest
from _wait import wait_until
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult

import guard
from guard.sdk._export import LowLatencySpanProcessor
from guard.testing import capture_spans

APP_SCRIPT = textwrap.dedent(
    """
    import json
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    import guard

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # the application's own pipeline
    tracer = trace.get_tracer("app")

    @guard.run(agent="app-bot", max_steps=3)
    def handle():
        with guard.step() as step:
            step.model_call(model="gpt-4.1", input_tokens=5, output_tokens=1)
        return "ok"

    with tracer.start_as_current_span("http request") as root:
        assert handle() == "ok"
    spans = exporter.get_finished_spans()
    run = [s for s in spans if s.name == "invoke_agent app-bot"][0]
    print(json.dumps({"names": [s.name for s in spans],
                      "same_trace": len({s.context.trace_id for s in spans}) == 1,
                      "run_parent_is_app": run.parent.span_id == root.get_span_context().span_id}))
    """
)


def test_application_tracer_provider_receives_the_spans() -> None:
    # A subprocess: the global provider can be set only once per process.
    out = subprocess.run(
        [sys.executable, "-c", APP_SCRIPT], capture_output=True, text=True, timeout=60, check=True
    )
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["names"] == ["chat gpt-4.1", "guard.step", "invoke_agent app-bot", "http request"]
    assert data["same_trace"] and data["run_parent_is_app"]


class _Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[tuple[str, dict]] = []
        self.metadata: list[dict] = []
        self.cond = threading.Condition()

    def Export(self, request, context):
        md = dict(context.invocation_metadata())
        with self.cond:
            self.metadata.append(md)
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        attrs = {kv.key: kv.value for kv in span.attributes}
                        self.spans.append((span.name, attrs))
            self.cond.notify_all()
        return trace_service_pb2.ExportTraceServiceResponse()

    def names(self) -> list[str]:
        with self.cond:
            return [n for n, _ in self.spans]

    def wait_for(self, name: str, timeout: float, n: int = 1) -> bool:
        """Until ``n`` spans named ``name`` have arrived (woken by each Export; bounded)."""
        with self.cond:
            return self.cond.wait_for(lambda: self.names().count(name) >= n, timeout)


@pytest.fixture
def collector():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    svc = _Collector()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(svc, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield svc, port
    server.stop(None)


def test_step_span_reaches_the_guard_quickly_through_the_real_otlp_exporter(collector) -> None:
    svc, port = collector
    with capture_spans(
        endpoint=f"127.0.0.1:{port}",
        token="t0ken",
        hmac_key=b"k" * 16,
        admit_timeout_ms=50,
        shutdown_ack_timeout_s=0.1,  # a span collector only: no control stream acks RunEnded
    ):
        # warm-up run: channel connect and first export pay one-time costs
        @guard.run(agent="warm")
        def warm() -> None:
            with guard.step():
                pass

        warm()
        assert svc.wait_for("invoke_agent warm", 10)
        release = threading.Event()

        @guard.run(agent="fast", max_steps=5)
        def f() -> None:
            with guard.step() as step:
                step.tool_call("search", {"q": "x"}, result=1)
            release.wait(30)  # the run is still going: the step span must not wait for it

        th = threading.Thread(target=f)
        th.start()
        # The order of events, not a latency: the step span reaches the guard while the run is
        # held open (an export at the run's end would time this wait out). How fast it gets
        # there is a figure of benchmarks/bench_cancel_latency.py (step end -> cancel).
        try:
            assert svc.wait_for("guard.step", 10, n=2), svc.names()  # warm's, then f's
            assert "invoke_agent fast" not in svc.names()
        finally:
            release.set()
            th.join(10)
        assert any(md.get("authorization") == "Bearer t0ken" for md in svc.metadata)
        assert guard.flush(5)
        names = svc.names()
        assert "invoke_agent fast" in names and "execute_tool search" in names


def test_export_errors_are_counted_not_raised() -> None:
    from guard.sdk._runtime import get_runtime

    with capture_spans(
        endpoint="127.0.0.1:9",
        export_timeout_s=0.2,
        admit_timeout_ms=10,
        shutdown_ack_timeout_s=0.1,
    ):

        @guard.run(agent="a")
        def f() -> str:
            with guard.step():
                pass
            return "fine"

        assert f() == "fine"  # nobody listens on port 9: the agent does not notice
        rt = get_runtime()
        rt.flush(3)
        assert rt.processor is not None and rt.processor.failed >= 1


# ------------------------------------------------------------------ span export settings


def _guarded_run() -> None:
    @guard.run(agent="pipeline-bot", max_steps=3)
    def f() -> str:
        with guard.step() as step:
            step.model_call(model="gpt-4.1", input_tokens=5, output_tokens=1)
        return "ok"

    assert f() == "ok"


def _span_names(raw: list[bytes]) -> list[str]:
    names = []
    for blob in raw:
        req = trace_service_pb2.ExportTraceServiceRequest.FromString(blob)
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                names.extend(s.name for s in ss.spans)
    return names


def test_span_export_none_keeps_the_control_stream_and_exports_nothing() -> None:
    """The application's own pipeline (a collector) already delivers the spans to the guard:
    the SDK sends none itself (no double export), the control stream is unchanged."""
    from _sdk_fake_guard import FakeGuard

    fake = FakeGuard()
    try:
        with capture_spans(endpoint=fake.endpoint, span_export="none") as sink:
            _guarded_run()
            assert not any(k.startswith("spans_") for k in guard.stats())
            # The application's pipeline still gets every span.
            assert {"chat gpt-4.1", "guard.step", "invoke_agent pipeline-bot"} <= set(sink.names())
            guard.shutdown()
        kinds = [m.WhichOneof("body") for m in fake.received]
        assert kinds[0] == "hello" and "run_started" in kinds and "run_ended" in kinds
        assert fake.traces.raw == []
    finally:
        fake.stop()


def test_span_endpoint_sends_spans_to_the_collector_and_control_to_the_guard() -> None:
    from _sdk_fake_guard import FakeGuard

    fake, collector = FakeGuard(), FakeGuard()
    try:
        with capture_spans(endpoint=fake.endpoint, span_endpoint=collector.endpoint):
            _guarded_run()
            guard.shutdown()
        assert {"chat gpt-4.1", "guard.step", "invoke_agent pipeline-bot"} <= set(
            _span_names(collector.traces.raw)
        )
        assert fake.traces.raw == []  # nothing went twice
        assert [m.WhichOneof("body") for m in collector.received] == []  # no control there
        assert "run_ended" in [m.WhichOneof("body") for m in fake.received]
    finally:
        fake.stop()
        collector.stop()


def test_shutdown_order_is_clean_with_the_applications_provider(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """guard.shutdown() and then the application's provider shutdown (at exit, possibly from
    two threads at once) shut the exporter down exactly once: no "already shutdown" logs,
    and the spans were delivered before the exporter closed."""
    from _sdk_fake_guard import FakeGuard
    from opentelemetry.sdk.trace import TracerProvider

    from guard.sdk._runtime import get_runtime

    fake = FakeGuard()
    provider = TracerProvider()
    try:
        with caplog.at_level("WARNING"):
            guard.configure(endpoint=fake.endpoint, tracer_provider=provider)
            _guarded_run()
            processor = get_runtime().processor
            assert processor is not None
            guard.shutdown()
            threads = [threading.Thread(target=processor.shutdown) for _ in range(4)]
            threads.append(threading.Thread(target=provider.shutdown))
            for t in threads:
                t.start()
            for t in threads:
                t.join(10)
        assert "invoke_agent pipeline-bot" in _span_names(fake.traces.raw)
        assert not [r for r in caplog.records if "already shutdown" in r.getMessage()]
        assert "run_ended" in [m.WhichOneof("body") for m in fake.received]
    finally:
        fake.stop()


def test_a_span_endpoint_list_moves_on_from_a_dead_collector() -> None:
    """``span_endpoint`` lists a dead collector and a live one: whichever this process starts
    at, every span reaches the live one and none is given up on."""
    import socket

    from _sdk_fake_guard import FakeGuard

    fake, collector = FakeGuard(), FakeGuard()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    try:
        for _ in range(4):  # the starting entry is random per process: try it a few times
            spans = f"{dead},{collector.endpoint}"
            with capture_spans(endpoint=fake.endpoint, span_endpoint=spans):
                _guarded_run()
                assert guard.flush(10)
                st = guard.stats()
                guard.shutdown()
            assert st["spans_failed"] == 0 and st["spans_exported"] >= 3, st
        assert {"chat gpt-4.1", "guard.step", "invoke_agent pipeline-bot"} <= set(
            _span_names(collector.traces.raw)
        )
        assert fake.traces.raw == []  # the control guard got none: spans went where asked
    finally:
        fake.stop()
        collector.stop()


class _CountingExporter:
    """A real SpanExporter of this process (no network): counts, and can hold an export."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.gate = threading.Event()
        self.gate.set()

    def export(self, spans):
        self.gate.wait(30)
        self.ids.extend(s.context.span_id for s in spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def _ended_spans(n: int) -> list:
    tracer = TracerProvider().get_tracer("t")
    out = []
    for i in range(n):
        s = tracer.start_span(f"s{i}")
        s.end()
        out.append(s)
    return out


def test_spans_ended_from_many_threads_are_all_exported_once() -> None:
    # The processor appends without a lock and wakes its worker only when it is idle: no span
    # may be lost (a missed wake-up leaves spans queued until the next one) or exported twice.
    from guard.sdk._export import LowLatencySpanProcessor

    exp = _CountingExporter()
    proc = LowLatencySpanProcessor(exp, max_delay_ms=0.0, max_batch=7, queue_size=100_000)
    spans = _ended_spans(8 * 500)
    threads = [
        threading.Thread(target=lambda part=spans[k::8]: [proc.on_end(s) for s in part])
        for k in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert proc.force_flush(30_000)
    assert sorted(exp.ids) == sorted(s.context.span_id for s in spans)
    assert (proc.exported, proc.dropped, proc.failed) == (len(spans), 0, 0)
    # After the burst the worker is idle again: a single late span still goes out.
    late = _ended_spans(1)[0]
    proc.on_end(late)
    assert proc.force_flush(30_000)
    assert exp.ids[-1] == late.context.span_id
    proc.shutdown()


def test_a_full_queue_counts_every_span_it_drops() -> None:
    exp = _CountingExporter()
    exp.gate.clear()  # the worker holds its first batch: the queue fills up behind it
    proc = LowLatencySpanProcessor(exp, max_delay_ms=0.0, max_batch=1, queue_size=10)
    spans = _ended_spans(200)
    proc.on_end(spans[0])
    wait_until(lambda: proc._busy, timeout_s=10)  # the worker holds span 0
    for s in spans[1:]:
        proc.on_end(s)
    exp.gate.set()
    assert proc.force_flush(30_000)
    assert proc.dropped == 200 - 1 - 10
    assert proc.exported == len(exp.ids) == 11
    proc.shutdown()
