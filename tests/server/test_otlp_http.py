"""OTLP/HTTP receiver (``serve --http-listen``) on a real guard: the stock
``opentelemetry-exporter-otlp-proto-http`` exporter and raw HTTP requests, checked against
the gRPC receiver's answers on the same spans."""

from __future__ import annotations

import asyncio
import gzip
import json
import shutil

import aiohttp
import grpc
import pytest
from _wait import wait_until_async
from google.rpc import status_pb2
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from guard.errors import ConfigError
from guard.server import GuardServer, TlsFiles
from guard.server.otlp._http import _OFF_LOOP_BYTES
from guard.v1 import guard_pb2_grpc

from . import test_tls
from .conftest import AUTH, AUTH_ENV, Agent, config, model_span, request, trace_id_of, two_tenants

PB = {"Content-Type": "application/x-protobuf"}
JS = {"Content-Type": "application/json"}


def chat_attrs(run_id: str, tokens_in: int, tokens_out: int) -> dict:
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "gpt-4.1",
        "gen_ai.usage.input_tokens": tokens_in,
        "gen_ai.usage.output_tokens": tokens_out,
        "guard.run.id": run_id,
    }


def stock_export(endpoint: str, trace_id: bytes, attrs: list[dict], **kw) -> SpanExportResult:
    """Spans made by the OpenTelemetry SDK in ``trace_id``, sent by the stock HTTP exporter."""
    memory = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(memory))
    parent = trace.set_span_in_context(
        NonRecordingSpan(
            SpanContext(int.from_bytes(trace_id, "big"), 1, True, TraceFlags(TraceFlags.SAMPLED))
        )
    )
    for a in attrs:
        with tp.get_tracer("third-party").start_as_current_span(
            "chat gpt-4.1", context=parent, attributes=a
        ):
            pass
    exporter = OTLPSpanExporter(endpoint=endpoint, timeout=5, **kw)
    try:
        return exporter.export(memory.get_finished_spans())
    finally:
        exporter.shutdown()


def usage(srv: GuardServer, run_id: str) -> tuple[int, int]:
    u = srv.registry.runs[run_id].budget.usage()
    return u.input_tokens, u.output_tokens


async def post(url: str, body: bytes, headers: dict) -> tuple[int, dict, bytes]:
    async with aiohttp.ClientSession() as s, s.post(url, data=body, headers=headers) as r:
        return r.status, dict(r.headers), await r.read()


def status_of(body: bytes) -> status_pb2.Status:
    return status_pb2.Status.FromString(body)


@pytest.fixture
async def srv(sink):
    cfg = config(runs={"max_tokens": 100_000})
    async with GuardServer(
        cfg, listen="127.0.0.1:0", sink=sink, http_listen="127.0.0.1:0"
    ) as server:
        yield server


def url(srv: GuardServer) -> str:
    return f"http://{srv.http.address}/v1/traces"


async def test_stock_exporter_counts_exactly_as_grpc(srv):
    agent = Agent(srv.address)
    await agent.connect()
    await agent.start_run("over-http", trace_id_of(1))
    await agent.start_run("over-grpc", trace_id_of(2))
    calls = [chat_attrs("over-http", 100 + i, 10 + i) for i in range(3)]
    result = await asyncio.to_thread(stock_export, url(srv), trace_id_of(1), calls)
    assert result is SpanExportResult.SUCCESS
    for i in range(3):
        await agent.export(
            model_span("over-grpc", trace_id_of(2), tokens_in=100 + i, tokens_out=10 + i)
        )
    assert usage(srv, "over-http") == usage(srv, "over-grpc") == (303, 33)
    # gzip, as the collector's otlphttp exporter sends by default
    result = await asyncio.to_thread(
        stock_export, url(srv), trace_id_of(1), calls[:1], compression=Compression.Gzip
    )
    assert result is SpanExportResult.SUCCESS
    assert usage(srv, "over-http") == (403, 43)
    await agent.close()


async def test_a_budget_reached_over_http_cancels_the_run(sink):
    async with GuardServer(
        config(runs={"max_tokens": 1000}),
        listen="127.0.0.1:0",
        sink=sink,
        http_listen="127.0.0.1:0",
    ) as srv:
        agent = Agent(srv.address)
        await agent.connect()
        await agent.start_run("r", trace_id_of(3))
        calls = [chat_attrs("r", 600, 0), chat_attrs("r", 600, 0)]
        await asyncio.to_thread(stock_export, url(srv), trace_id_of(3), calls)
        cancel = await agent.wait_for(lambda m: m.WhichOneof("body") == "cancel")
        assert cancel.cancel.reason == "token_budget"
        await agent.close()


def _json_request(trace_hex: str, span_hex: str, run_id: str) -> dict:
    """An OTLP/JSON body with the spec's quirks: hex ids (any case), lowerCamelCase keys,
    int64 as a string and as a number, an enum as an integer, and a field from the future."""
    return {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "x"}}]
                },
                "scopeSpans": [
                    {
                        "scope": {"name": "openllmetry"},
                        "spans": [
                            {
                                "traceId": trace_hex,
                                "spanId": span_hex,
                                "parentSpanId": "",
                                "name": "chat gpt-4.1",
                                "kind": 3,
                                "startTimeUnixNano": "1700000000000000000",
                                "endTimeUnixNano": 1700000000500000000,
                                "attributes": [
                                    {
                                        "key": "gen_ai.operation.name",
                                        "value": {"stringValue": "chat"},
                                    },
                                    {
                                        "key": "gen_ai.usage.input_tokens",
                                        "value": {"intValue": "120"},
                                    },
                                    {"key": "gen_ai.usage.output_tokens", "value": {"intValue": 7}},
                                    {"key": "guard.run.id", "value": {"stringValue": run_id}},
                                ],
                                "status": {"code": 1},
                                "links": [{"traceId": "AB" * 16, "spanId": "cd" * 8}],
                                "someFieldFromTheFuture": {"nested": [1, 2]},
                            }
                        ],
                    }
                ],
            }
        ]
    }


async def test_json_body_with_the_spec_quirks(srv):
    agent = Agent(srv.address)
    await agent.connect()
    await agent.start_run("j", trace_id_of(4))
    body = json.dumps(_json_request(trace_id_of(4).hex().upper(), "0000000000000abc", "j"))
    code, headers, out = await post(url(srv), body.encode(), JS)
    assert code == 200 and headers["Content-Type"].startswith("application/json")
    assert json.loads(out) == {}  # full success: partial_success unset
    assert usage(srv, "j") == (120, 7)
    # the same body gzipped, charset parameter on the media type
    gz = gzip.compress(body.encode())
    hdrs = {"Content-Type": "application/json; charset=utf-8", "Content-Encoding": "gzip"}
    assert (await post(url(srv), gz, hdrs))[0] == 200
    assert usage(srv, "j") == (240, 14)
    # a bad hex id: 400 with a JSON Status, nothing counted
    bad = json.dumps(_json_request("zz" * 16, "0000000000000abc", "j")).encode()
    code, headers, out = await post(url(srv), bad, JS)
    assert code == 400 and headers["Content-Type"].startswith("application/json")
    assert "is not hex" in json.loads(out)["message"]
    for junk in (b"[1, 2]", b"{", b'{"resourceSpans": 5}', b"[" * 100_000):
        code, _, out = await post(url(srv), junk, JS)
        assert code == 400, junk[:20]
        assert json.loads(out)["message"]
    assert usage(srv, "j") == (240, 14)
    # an empty body is an empty request (spec: success); a large one (converted off the loop)
    assert (await post(url(srv), b"", JS))[:1] == (200,)
    many = _json_request(trace_id_of(4).hex(), "0000000000000abc", "j")
    spans = many["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans *= 300  # ~190 KiB of JSON
    assert len(json.dumps(many)) > _OFF_LOOP_BYTES
    assert (await post(url(srv), json.dumps(many).encode(), JS))[0] == 200
    assert usage(srv, "j") == (240 + 300 * 120, 14 + 300 * 7)
    await agent.close()


async def test_partial_success_in_the_request_content_type(sink):
    cfg = config(guard={"max_tracked_runs": 1})
    async with GuardServer(cfg, listen="127.0.0.1:0", sink=sink, http_listen="127.0.0.1:0") as srv:
        agent = Agent(srv.address)
        await agent.connect()
        await agent.start_run("only", trace_id_of(5))
        # a span-only run beyond the cap is refused per span, as over gRPC
        req = request(model_span("implicit", trace_id_of(999)))
        grpc_resp = await agent.export(model_span("implicit", trace_id_of(998)))
        code, headers, out = await post(url(srv), req.SerializeToString(), PB)
        assert code == 200 and headers["Content-Type"] == "application/x-protobuf"
        resp = otlp.ExportTraceServiceResponse.FromString(out)
        assert resp.partial_success.rejected_spans == grpc_resp.partial_success.rejected_spans == 1
        assert resp.partial_success.error_message
        js = json.dumps(_json_request(trace_id_of(997).hex(), "00000000000000aa", "implicit2"))
        code, _, out = await post(url(srv), js.encode(), JS)
        assert code == 200
        assert json.loads(out)["partialSuccess"]["rejectedSpans"] == "1"  # int64: a string
        await agent.close()


async def test_auth_like_grpc(sink):
    cfg = config(auth=AUTH)
    async with GuardServer(
        cfg, listen="127.0.0.1:0", sink=sink, environ=AUTH_ENV, http_listen="127.0.0.1:0"
    ) as srv:
        acme, globex = await two_tenants(srv.address)
        one = [chat_attrs("a1", 999, 1)]
        # no token, an unknown token: 401, nothing counted
        for headers in (None, {"Authorization": "Bearer nope"}, {"Authorization": "Basic eA=="}):
            result = await asyncio.to_thread(
                stock_export, url(srv), trace_id_of(2), one, headers=headers
            )
            assert result is SpanExportResult.FAILURE
        code, hdrs, out = await post(url(srv), request().SerializeToString(), PB)
        assert code == 401 and hdrs["WWW-Authenticate"] == "Bearer"
        assert "authorization" in status_of(out).message
        # globex's token on acme's run: answered as over gRPC (as an unknown run), acme untouched
        grpc_resp = await globex.export(model_span("a1", trace_id_of(2), tokens_in=999))
        body = request(model_span("a1", trace_id_of(2), tokens_in=999)).SerializeToString()
        code, _, out = await post(url(srv), body, {**PB, "Authorization": "Bearer globex-secret"})
        assert code == 200 and otlp.ExportTraceServiceResponse.FromString(out) == grpc_resp
        assert usage(srv, "a1") == (0, 0)
        # acme's own token counts
        ok = await asyncio.to_thread(
            stock_export,
            url(srv),
            trace_id_of(2),
            one,
            headers={"Authorization": "Bearer acme-secret"},
        )
        assert ok is SpanExportResult.SUCCESS and usage(srv, "a1") == (999, 1)
        await acme.close()
        await globex.close()


async def test_bad_requests_get_their_status_and_change_nothing(sink):
    async with GuardServer(
        config(),
        listen="127.0.0.1:0",
        sink=sink,
        http_listen="127.0.0.1:0",
        max_message_bytes=1 << 20,
    ) as srv:
        agent = Agent(srv.address)
        await agent.connect()
        await agent.start_run("b", trace_id_of(6))
        good = request(
            model_span("b", trace_id_of(6), tokens_in=5, tokens_out=1)
        ).SerializeToString()
        base = "http://" + srv.http.address
        cases = [
            (url(srv), b"\x0a\xff\xff\xff", PB, 400, "malformed OTLP"),
            (url(srv), good, {"Content-Type": "text/plain"}, 415, "content type"),
            (url(srv), good, {**PB, "Content-Encoding": "br"}, 415, "content encoding"),
            (url(srv), b"\x1f\x8b junk", {**PB, "Content-Encoding": "gzip"}, 400, "gzip"),
            (url(srv), gzip.compress(good)[:-6], {**PB, "Content-Encoding": "gzip"}, 400, "trunc"),
            (url(srv), b"\0" * ((1 << 20) + 1), PB, 413, "exceeds"),
            # a zip bomb: 64 KiB on the wire, 64 MiB inflated; refused at the bound
            (
                url(srv),
                gzip.compress(b"\0" * (64 << 20)),
                {**PB, "Content-Encoding": "gzip"},
                413,
                "decompresses",
            ),
            (base + "/v1/metrics", good, PB, 404, "no such path"),
        ]
        for target, body, headers, want, text in cases:
            code, _, out = await post(target, body, headers)
            assert (code, text in status_of(out).message) == (want, True), (text, code, out[:200])

        # chunked (no Content-Length) and over the bound
        async def chunks():
            for _ in range(20):
                yield b"\0" * 65536

        async with aiohttp.ClientSession() as s, s.post(url(srv), data=chunks(), headers=PB) as r:
            assert r.status == 413
        async with aiohttp.ClientSession() as s, s.get(url(srv)) as r:
            assert r.status == 405 and r.headers["Allow"] == "POST"
        assert usage(srv, "b") == (0, 0) and srv.registry.stats["spans"] == 0
        assert srv.export_refusals["INVALID_ARGUMENT"] == 3
        assert srv.export_refusals["RESOURCE_EXHAUSTED"] == 3
        # and the good body still counts
        assert (await post(url(srv), good, PB))[0] == 200 and usage(srv, "b") == (5, 1)
        await agent.close()


async def test_draining_answers_503_with_retry_after(srv):
    srv.draining = True  # what stop() sets first, before both transports drain
    try:
        code, headers, out = await post(url(srv), request().SerializeToString(), PB)
    finally:
        srv.draining = False
    assert code == 503 and headers["Retry-After"] == "1"
    assert "draining" in status_of(out).message
    assert srv.export_refusals["UNAVAILABLE"] == 1


async def _raw(address: str, head: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head)
    await writer.drain()
    return reader, writer


async def test_slow_and_piling_up_bodies_are_bounded(srv):
    srv.http.body_timeout_s = 0.3  # read per request
    head = b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
    # a body that never arrives: 408, the connection is closed
    reader, writer = await _raw(srv.http.address, head + b"Content-Length: 100\r\n\r\nabc")
    status = await asyncio.wait_for(reader.readline(), 10)
    assert status.startswith(b"HTTP/1.1 408"), status
    writer.close()
    # bodies in flight hold at most INFLIGHT_FACTOR x max_message_bytes: the next gets 429
    srv.http.body_timeout_s = 30.0
    cap = srv.http.budget.cap
    big = cap - 100
    srv.http.budget.cap = big + 100
    srv.http.max_body_bytes = big  # let one request hold nearly the whole budget
    reader, writer = await _raw(srv.http.address, head + f"Content-Length: {big}\r\n\r\n".encode())
    await wait_until_async(lambda: srv.http.budget.held, 10, "the slow body's bytes held")
    assert srv.http.budget.held == big
    code, headers, out = await post(url(srv), b"\0" * 200, PB)
    assert code == 429 and headers["Retry-After"] == "1" and "in flight" in status_of(out).message
    writer.close()
    # given back when the client went away
    await wait_until_async(lambda: srv.http.budget.held == 0, 10, "the held bytes given back")
    assert (await post(url(srv), request().SerializeToString(), PB))[0] == 200


def test_non_loopback_http_needs_auth():
    with pytest.raises(ConfigError, match=r"refusing to bind '0\.0\.0\.0:4318'"):
        GuardServer(config(), listen="127.0.0.1:0", http_listen="0.0.0.0:4318")
    GuardServer(
        config(auth=AUTH), listen="127.0.0.1:0", http_listen="0.0.0.0:4318", environ=AUTH_ENV
    )


cert = test_tls.cert  # the same self-signed certificate fixture as the gRPC TLS tests


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
async def test_tls_with_the_grpc_files(cert, sink, monkeypatch):
    crt, key = cert
    for var in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):  # requests lets them override verify=
        monkeypatch.delenv(var, raising=False)
    async with GuardServer(
        config(runs={"max_tokens": 10_000}),
        listen="127.0.0.1:0",
        sink=sink,
        tls=TlsFiles(cert=crt, key=key),
        http_listen="127.0.0.1:0",
    ) as srv:
        agent_tls = grpc_ssl_agent(srv.address, crt)
        await agent_tls.connect()
        await agent_tls.start_run("t", trace_id_of(7))
        port = srv.http.port
        one = [chat_attrs("t", 50, 5)]
        ok = await asyncio.to_thread(
            stock_export, f"https://localhost:{port}/v1/traces", trace_id_of(7), one,
            certificate_file=crt,
        )  # fmt: skip
        assert ok is SpanExportResult.SUCCESS and usage(srv, "t") == (50, 5)
        plain = await asyncio.to_thread(
            stock_export, f"http://127.0.0.1:{port}/v1/traces", trace_id_of(7), one
        )
        assert plain is SpanExportResult.FAILURE and usage(srv, "t") == (50, 5)
        await agent_tls.close()


def grpc_ssl_agent(address: str, crt: str) -> Agent:
    agent = Agent(address)
    with open(crt, "rb") as fh:
        creds = grpc.ssl_channel_credentials(fh.read())
    agent.channel = grpc.aio.secure_channel(
        address, creds, options=[("grpc.ssl_target_name_override", "localhost")]
    )
    agent.stub = guard_pb2_grpc.GuardControlStub(agent.channel)
    return agent
