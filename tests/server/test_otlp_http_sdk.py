"""OTLP/HTTP end to end: a guarded SDK run whose spans reach the guard only through the
application's own pipeline with the stock HTTP exporter, and ``otel-guard serve`` flags."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import guard
from guard.sdk._api import reset
from guard.sdk._config import ENV
from guard.server import MemorySink, ServerThread

from .conftest import config


@pytest.fixture(autouse=True)
def _clean_sdk(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    reset()
    yield
    reset()


def test_run_stopped_by_the_guard_from_spans_over_http() -> None:
    """span_export="none": the SDK exports nothing itself, the app's pipeline sends every span
    (the SDK's own and an instrumentation's) over OTLP/HTTP; the guard counts the model calls
    and stops the run for its token budget."""
    cfg = config(runs={"max_tokens": 5000})
    with ServerThread(cfg, sink=MemorySink(), http_listen="127.0.0.1:0") as srv:
        endpoint = f"http://{srv.server.http.address}/v1/traces"
        app_tp = TracerProvider()
        app_tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        guard.configure(
            endpoint=srv.address, span_export="none", tracer_provider=app_tp, admit_timeout_ms=3000
        )
        tracer = app_tp.get_tracer("an-instrumentation")
        calls = 0

        @guard.run(agent="http-bot", max_steps=1000)
        def agent() -> str:
            nonlocal calls
            for _ in range(300):  # a runaway, bounded so that a broken receiver fails, not hangs
                with guard.step():
                    attrs = {
                        "gen_ai.operation.name": "chat",
                        "gen_ai.request.model": "gpt-4.1",
                        "gen_ai.usage.input_tokens": 1000,
                        "gen_ai.usage.output_tokens": 0,
                    }
                    with tracer.start_as_current_span("chat gpt-4.1", attributes=attrs):
                        calls += 1
                time.sleep(0.01)  # pacing only: the cancel has a few ms to come back
            return "ran away"

        with pytest.raises(guard.RunStopped) as stop:
            agent()
        counted = srv.call(lambda: srv.server.registry.stats["foreign_model_calls"])
        guard.shutdown()
        app_tp.shutdown()
    assert stop.value.outcome.reason == "token_budget"
    assert "tokens=" in stop.value.outcome.message
    assert calls >= 5  # 5000 tokens: the 5th call reaches the budget
    assert counted == calls  # every call that came over HTTP counted once


def _serve(*args: str) -> tuple[subprocess.Popen, dict]:
    cmd = [sys.executable, "-m", "guard.cli", "serve", "--listen", "127.0.0.1:0", "--no-store"]
    proc = subprocess.Popen(
        [*cmd, "--json", "--log-level", "WARNING", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(10)
        return proc, {"error": proc.stderr.read()}  # type: ignore[union-attr]
    return proc, json.loads(line)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(20)
    for f in (proc.stdout, proc.stderr):
        if f is not None:
            f.close()


def test_serve_http_listen_flag() -> None:
    proc, shown = _serve()  # --listen on an ephemeral port: HTTP on one too, shown
    try:
        assert shown["http_address"].startswith("127.0.0.1:"), shown
        req = urllib.request.Request(
            f"http://{shown['http_address']}/v1/traces",
            data=b"",
            headers={"Content-Type": "application/x-protobuf"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:  # an empty Export: success
            assert resp.status == 200 and resp.headers["Content-Type"] == "application/x-protobuf"
    finally:
        _stop(proc)
    proc, shown = _serve("--http-listen", "none")
    try:
        assert shown["address"] and shown["http_address"] is None
    finally:
        _stop(proc)
    proc, shown = _serve("--http-listen", "0.0.0.0:0")
    assert proc.returncode == 2 and "refusing to bind '0.0.0.0:0'" in shown["error"]
    _stop(proc)


def test_http_port_in_use_fails_the_start() -> None:
    proc, shown = _serve("--http-listen", "127.0.0.1:0")
    try:
        taken = shown["http_address"]
        other, out = _serve("--http-listen", taken)
        assert other.returncode == 2 and f"could not bind --http-listen {taken}" in out["error"]
        _stop(other)
    finally:
        _stop(proc)


def test_served_404_for_other_paths() -> None:
    proc, shown = _serve()
    try:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://{shown['http_address']}/", timeout=10)
        assert err.value.code == 404 and err.value.headers["Server"] == "otel-guard"
        err.value.close()
    finally:
        _stop(proc)
