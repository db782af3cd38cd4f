"""Spans pass through a real collector (rotel, configured from collector/rotel.env) unchanged."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest
from _deploy_rotel import read_env_file, run_rotel
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

pytestmark = pytest.mark.slow


class _Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """A tiny OTLP TraceService that records every span with its arrival time."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, str, dict]] = []
        self.cond = threading.Condition()

    def Export(self, request, context):
        now = time.monotonic()
        with self.cond:
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        attrs = {kv.key: kv.value for kv in span.attributes}
                        self.spans.append((now, span.name, attrs))
            self.cond.notify_all()
        return trace_service_pb2.ExportTraceServiceResponse()

    def wait_for(self, n: int, timeout_s: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: len(self.spans) >= n, timeout=timeout_s)


@pytest.fixture
def receiver():
    servicer = _Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(grace=None)


def _provider(endpoint: str) -> TracerProvider:
    tp = TracerProvider(resource=Resource.create({"service.name": "rotel-e2e"}))
    tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True)))
    return tp


def test_rotel_env_flushes_fast():
    env = read_env_file()
    assert env["ROTEL_EXPORTER"] == "otlp"
    assert env["ROTEL_OTLP_EXPORTER_PROTOCOL"] == "grpc"
    timeout = env["ROTEL_TRACES_BATCH_TIMEOUT"]
    assert timeout.endswith("ms") and int(timeout[:-2]) <= 50, timeout


def test_spans_pass_through_rotel(receiver, tmp_path):
    servicer, endpoint = receiver
    with run_rotel(endpoint, tmp_path) as rotel:
        tp = _provider(rotel.endpoint)
        tracer = tp.get_tracer("guard-e2e")
        with tracer.start_as_current_span("invoke_agent refund-bot") as run_span:
            run_span.set_attribute("guard.run.id", "run-1")
            for i in range(1, 21):
                with tracer.start_as_current_span("guard.step") as step:
                    step.set_attribute("guard.run.id", "run-1")
                    step.set_attribute("guard.step.index", i)
                    step.set_attribute("guard.action.fingerprint", f"{i:032x}")
                time.sleep(0.01)
        assert servicer.wait_for(21, timeout_s=15), rotel.log()
        tp.shutdown()

    steps = [(t, a) for t, name, a in servicer.spans if name == "guard.step"]
    assert sorted(a["guard.step.index"].int_value for _, a in steps) == list(range(1, 21))
    assert all(a["guard.run.id"].string_value == "run-1" for _, a in steps)
    assert {a["guard.action.fingerprint"].string_value for _, a in steps} == {
        f"{i:032x}" for i in range(1, 21)
    }
