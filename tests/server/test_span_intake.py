"""The span intake: span requests are admitted per tenant, queued, and applied a slice per
turn of the loop, so a flood of them never holds a control message for more than one slice,
and one tenant's flood is shed alone.

The intake runs against a real registry and the real decoder; ``ingest_export`` is the one
path of both OTLP transports, so what holds here holds for gRPC and HTTP alike.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from guard.errors import GuardUnavailable, InvalidInput
from guard.policy import PolicyConfig
from guard.server import GuardServer, MemorySink
from guard.server.otlp._grpc import ingest_export
from guard.server.otlp._intake import MIN_COST_BYTES, SLICE_SPANS, TURN_BUDGET_S, SpanIntake
from guard.server.runs._registry import Registry
from guard.server.runtime._auth import Principal
from guard.server.runtime._fair import TenantTurns
from guard.server.runtime._status import Overloaded

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _kv(key: str, value: str | int) -> common_pb2.KeyValue:
    if isinstance(value, int):
        return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(int_value=value))
    return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(string_value=value))


def _request(run: str, spans: int, tenant: str | None = None) -> bytes:
    """``spans`` model spans of one run (10 input and 1 output tokens each)."""
    attrs = [
        _kv("gen_ai.operation.name", "chat"),
        _kv("gen_ai.request.model", "gpt-4.1"),
        _kv("gen_ai.usage.input_tokens", 10),
        _kv("gen_ai.usage.output_tokens", 1),
        _kv("guard.run.id", run),
    ]
    if tenant is not None:
        attrs.append(_kv("guard.tenant", tenant))
    trace = (abs(hash(run)) | 1 << 100).to_bytes(16, "big")
    body = [
        trace_pb2.Span(
            name="chat gpt-4.1",
            trace_id=trace,
            span_id=(i + 1).to_bytes(8, "big"),
            attributes=attrs,
        )
        for i in range(spans)
    ]
    req = otlp.ExportTraceServiceRequest(resource_spans=[{"scope_spans": [{"spans": body}]}])
    return req.SerializeToString()


class _Host:
    """A registry whose applier counts its slices, and the intake in front of it."""

    def __init__(self, cap_bytes: int = 64 << 20, turn_budget_s: float = 0.0) -> None:
        self.registry = Registry(PolicyConfig.from_dict(None), MemorySink(), guard_id="t")
        self.slices: list[str | None] = []  # the tenant of every slice applied, in order
        ingest = self.registry.ingest

        def counted(decoded, principal):
            self.slices.append(principal.tenant)
            return ingest(decoded, principal)

        self.registry.ingest = counted  # what both the intake and the old inline path call
        self.turns = TenantTurns()
        # one step per turn of the loop by default, so that the tests can count steps
        self.intake = SpanIntake(
            counted, cap_bytes, self.registry.stats, turn_budget_s=turn_budget_s
        )

    def tokens(self, run: str) -> int:
        r = self.registry.runs[run]
        return r.budget.usage().input_tokens


def _who(tenant: str) -> Principal:
    return Principal(tenant=tenant, admin=False)


async def test_a_control_message_waits_for_one_slice_however_many_requests_are_in_flight():
    host = _Host()
    host.intake.start()
    try:
        flood = [
            asyncio.ensure_future(ingest_export(host, _request(f"a{i}", SLICE_SPANS), _who("a")))
            for i in range(24)
        ]
        await asyncio.sleep(0)  # every request has arrived and is in flight
        seen: list[int] = []
        asyncio.get_running_loop().call_soon(lambda: seen.append(len(host.slices)))
        await asyncio.gather(*flood)
        assert len(host.slices) == 24
        # Applied inline in each handler, all 24 slices ran before the callback did.
        assert seen and seen[0] <= 1, f"a control callback waited for {seen[0]} slices"
    finally:
        await host.intake.stop()


async def test_the_worker_holds_the_loop_for_its_turn_budget_not_for_the_flood():
    host = _Host(turn_budget_s=TURN_BUDGET_S)
    host.intake.start()
    try:
        flood = [
            asyncio.ensure_future(ingest_export(host, _request(f"a{i}", SLICE_SPANS), _who("a")))
            for i in range(400)
        ]
        await asyncio.sleep(0)
        seen: list[int] = []
        asyncio.get_running_loop().call_soon(lambda: seen.append(len(host.slices)))
        await asyncio.gather(*flood)
        assert len(host.slices) == 400
        assert seen and seen[0] < 400, "a control callback waited for the whole flood"
    finally:
        await host.intake.stop()


async def test_another_tenants_request_is_applied_after_one_slice_of_the_flood():
    host = _Host()
    host.intake.start()
    try:
        flood = [
            asyncio.ensure_future(
                ingest_export(host, _request(f"a{i}", 3 * SLICE_SPANS), _who("a"))
            )
            for i in range(8)
        ]
        await asyncio.sleep(0)
        canary = asyncio.ensure_future(ingest_export(host, _request("b0", 4), _who("b")))
        await canary
        before_b = host.slices.index("b")
        assert before_b <= 2, f"tenant b's request waited behind {before_b} slices of a's"
        await asyncio.gather(*flood)
        assert host.tokens("b0") == 40
        assert all(host.tokens(f"a{i}") == 3 * SLICE_SPANS * 10 for i in range(8))
    finally:
        await host.intake.stop()


async def test_a_flooding_tenant_is_shed_alone_and_told_when_to_retry():
    body = _request("a", 64)
    cap = 4 * len(body)
    host = _Host(cap_bytes=cap)
    host.intake.start()
    try:
        # twelve requests arrive in one turn of the loop, before the worker applies any
        flood = [asyncio.ensure_future(host.intake.export(body, _who("a"))) for _ in range(12)]
        await asyncio.sleep(0)
        # tenant b has nothing queued: admitted although a holds its whole share
        b = await host.intake.export(_request("b", 4), _who("b"))
        assert b == (0, [])
        results = await asyncio.gather(*flood, return_exceptions=True)
        shed = [r for r in results if isinstance(r, Overloaded)]
        assert len(shed) == 8, results  # a's queue held its share: 4 requests of the cap
        exc = shed[0]
        assert exc.retry_after_s == 1.0
        assert "tenant 'a'" in str(exc) and f"of {cap}" in str(exc)
        assert host.registry.stats["span_requests_shed"] == 8
        assert host.tokens("a") == 64 * 10 * 4
    finally:
        await host.intake.stop()


def test_admission_bounds_the_queue_by_share_and_in_all():
    host = _Host(cap_bytes=100_000)
    intake = host.intake
    intake._admit("a", 60_000)  # nothing queued: admitted
    intake._held["a"], intake._total = 60_000, 60_000
    intake._queues["a"] = object()  # a has queued work
    with pytest.raises(Overloaded):
        intake._admit("a", 50_000)  # 110k > a's share (100k, alone)
    intake._admit("b", 40_000)  # b: share 50k of 2 tenants, nothing queued
    intake._admit("a", MIN_COST_BYTES)  # 64k of a's 100k share (b has nothing queued yet)
    intake._held["b"], intake._total = 40_000, 100_000
    intake._queues["b"] = object()
    with pytest.raises(Overloaded):  # b holds 40k of its 50k share: 20k more is too much
        intake._admit("b", 20_000)
    intake._admit("c", 150_000)  # nothing queued: one request of any size, while there is room
    intake._total = 2 * 100_000 + 1  # the whole queue past its hard bound
    with pytest.raises(Overloaded):
        intake._admit("c", MIN_COST_BYTES)  # even a tenant with nothing queued


async def test_a_request_whose_caller_left_before_it_was_reached_is_not_applied():
    host = _Host()
    host.intake.start()
    try:
        first = asyncio.ensure_future(host.intake.export(_request("x", 2 * SLICE_SPANS), _who("a")))
        gone = asyncio.ensure_future(host.intake.export(_request("y", 8), _who("a")))
        await asyncio.sleep(0)
        gone.cancel()  # its deadline passed: the exporter will send it again
        await first
        with pytest.raises(asyncio.CancelledError):
            await gone
        for _ in range(5):
            await asyncio.sleep(0)
        assert "y" not in host.registry.runs
        assert host.registry.stats["span_requests_abandoned"] == 1
    finally:
        await host.intake.stop()


async def test_a_malformed_request_is_refused_whole_and_the_worker_goes_on():
    host = _Host()
    host.intake.start()
    try:
        good = _request("m", 2 * SLICE_SPANS + 10)
        bad = good + b"\x0a\xff\xff\xff\xff\x0f"  # a last field announcing 4 GiB
        with pytest.raises(InvalidInput):
            await host.intake.export(bad, _who("a"))
        assert "m" not in host.registry.runs  # no slice of it was applied
        assert await host.intake.export(_request("n", 3), _who("a")) == (0, [])
        assert host.tokens("n") == 30
    finally:
        await host.intake.stop()


async def test_requests_still_queued_at_stop_are_refused_as_unavailable():
    host = _Host()
    host.intake.start()
    jobs = [
        asyncio.ensure_future(host.intake.export(_request(f"s{i}", SLICE_SPANS), _who("a")))
        for i in range(4)
    ]
    await asyncio.sleep(0)
    await host.intake.stop()
    results = await asyncio.gather(*jobs, return_exceptions=True)
    assert any(isinstance(r, GuardUnavailable) for r in results)
    with pytest.raises(GuardUnavailable):
        await host.intake.export(_request("late", 1), _who("a"))


async def test_grpc_sheds_with_resource_exhausted_and_a_retry_delay():
    cfg = PolicyConfig.from_dict({"guard": {"max_queued_span_bytes": 65536}})
    body = _request("g", 400)
    async with (
        GuardServer(cfg, listen="127.0.0.1:0") as srv,
        grpc.aio.insecure_channel(srv.address) as ch,
    ):
        call = ch.unary_unary(EXPORT)
        # the worker held back, so the requests meet a full share whatever their timing
        worker = srv.intake._task
        worker.cancel()
        # fewer than a connection's concurrent streams, so every call reaches the intake
        calls = [asyncio.ensure_future(call(body)) for _ in range(12)]
        while sum(f.done() for f in calls) + len(srv.intake._queues.get(None, ())) < 12:
            await asyncio.sleep(0.01)
        srv.intake._task = asyncio.ensure_future(srv.intake._work())
        results = await asyncio.gather(*calls, return_exceptions=True)
    shed = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(shed) == 11  # one request fits the share; the rest wait for nothing
    err = shed[0]
    assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "span intake full" in err.details()
    trailers = dict(err.trailing_metadata())
    status = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
    info = error_details_pb2.RetryInfo()
    assert status.details[0].Unpack(info)
    assert info.retry_delay.seconds == 1
    # where the OpenTelemetry Python exporter reads its backoff from
    plain = error_details_pb2.RetryInfo.FromString(trailers["google.rpc.retryinfo-bin"])
    assert plain.retry_delay.seconds == 1
    figures = srv.figures()
    assert figures["span_requests_shed"] == len(shed)
    assert figures["span_queue_bytes"] == 0.0
    assert srv.registry.stats["spans"] == 400  # the one admitted was applied


def test_the_queue_size_is_a_validated_setting():
    assert PolicyConfig.from_dict(None).guard.max_queued_span_bytes == 8 << 20
    with pytest.raises(Exception, match="max_queued_span_bytes"):
        PolicyConfig.from_dict({"guard": {"max_queued_span_bytes": 10}})


async def test_memory_is_given_back_once_ingest_goes_quiet_after_a_burst(monkeypatch):
    import guard.server.otlp._intake as intake_mod

    trims: list[int] = []
    monkeypatch.setattr(intake_mod, "TRIM_AFTER_BYTES", 3 * MIN_COST_BYTES)
    monkeypatch.setattr(intake_mod, "QUIET_S", 0.05)
    monkeypatch.setattr(intake_mod._memtrim, "after_burst", lambda: trims.append(1) or True)
    host = _Host()
    host.intake.start()
    try:
        await host.intake.export(_request("q0", 2), _who("a"))  # below the burst size
        await asyncio.sleep(0.2)
        assert trims == []  # a quiet guard that saw no burst does not trim
        for i in range(4):
            await host.intake.export(_request(f"q{i + 1}", 2), _who("a"))
        assert trims == []  # not while requests keep coming
        await asyncio.sleep(0.2)
        assert trims == [1]  # once, after the burst, when quiet
        await asyncio.sleep(0.2)
        assert trims == [1]
    finally:
        await host.intake.stop()


async def test_collections_are_small_while_load_is_shed_and_usual_once_quiet(monkeypatch):
    import gc

    import guard.server.otlp._intake as intake_mod
    import guard.server.runtime._gc as gc_mod

    monkeypatch.setattr(intake_mod, "QUIET_S", 0.05)
    monkeypatch.setattr(gc_mod, "_bounded", True)  # as in `otel-guard serve`
    saved = gc.get_threshold()
    gc.set_threshold(gc_mod.YOUNG_THRESHOLD, *saved[1:])
    body = _request("o", 64)
    host = _Host(cap_bytes=2 * len(body))
    host.intake.start()
    try:
        flood = [asyncio.ensure_future(host.intake.export(body, _who("a"))) for _ in range(8)]
        results = await asyncio.gather(*flood, return_exceptions=True)
        assert any(isinstance(r, Overloaded) for r in results)
        assert gc.get_threshold()[0] == gc_mod.OVERLOAD_YOUNG_THRESHOLD
        await asyncio.sleep(0.3)  # quiet: the usual settings again
        assert gc.get_threshold()[0] == gc_mod.YOUNG_THRESHOLD
    finally:
        await host.intake.stop()
        gc.set_threshold(*saved)


async def test_http_sheds_a_tenant_past_its_share_before_reading_the_body():
    cfg = PolicyConfig.from_dict({"guard": {"max_queued_span_bytes": 65536}})
    body = _request("h", 400)
    async with GuardServer(cfg, listen="127.0.0.1:0", http_listen="127.0.0.1:0") as srv:
        srv.intake._task.cancel()  # the worker held back: the first request stays queued
        host, port = srv.http.address.rsplit(":", 1)
        head = (
            "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        r1, w1 = await asyncio.open_connection(host, int(port))
        w1.write(head + body)
        await w1.drain()
        while not srv.intake._queues:
            await asyncio.sleep(0.01)
        r2, w2 = await asyncio.open_connection(host, int(port))
        w2.write(head)  # the headers only: the body is never sent
        await w2.drain()
        status = await asyncio.wait_for(r2.readline(), 10)
        assert status.startswith(b"HTTP/1.1 429"), status
        rest = await asyncio.wait_for(r2.read(4096), 10)
        assert b"Retry-After: 1" in rest and b"span intake full" in rest
        srv.intake._task = asyncio.ensure_future(srv.intake._work())
        assert (await asyncio.wait_for(r1.readline(), 10)).startswith(b"HTTP/1.1 200")
        for w in (w1, w2):
            w.close()
        figures = srv.figures()
    assert figures["span_requests_shed"] == 1 and figures["span_bytes_shed"] == len(body)


def test_garbage_frozen_while_alive_is_reclaimed(monkeypatch):
    import gc
    import weakref

    import guard.server.runtime._gc as gc_mod

    class Body:
        pass

    monkeypatch.setattr(gc_mod, "_bounded", True)
    body = Body()
    cycle = [body]
    cycle.append(cycle)  # a cycle, as a frame and the exception it raised make
    alive = weakref.ref(body)
    gc.freeze()  # it was alive at a full collection: frozen with the survivors
    try:
        del body, cycle
        gc.collect()
        assert alive() is not None  # frozen: no collection ever looks at it again
        assert gc_mod.reclaim_frozen() >= 1
        assert alive() is None
    finally:
        gc.unfreeze()
