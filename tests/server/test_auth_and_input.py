"""Auth matrix and bad input, each answered with a clear gRPC status on a real server."""

from __future__ import annotations

import asyncio
import math

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as otlp_grpc

from guard.cli._client import AdminClient
from guard.errors import AuthError, ConfigError, GuardUnavailable, InvalidInput
from guard.server import GuardServer
from guard.v1 import guard_pb2 as pb
from guard.v1 import guard_pb2_grpc

from .conftest import (
    AUTH,
    AUTH_ENV,
    Agent,
    config,
    model_span,
    raw_request,
    raw_span,
    request,
    trace_id_of,
    two_tenants,
)


@pytest.fixture
async def authed(sink):
    cfg = config(auth=AUTH)
    async with GuardServer(cfg, listen="127.0.0.1:0", sink=sink, environ=AUTH_ENV) as srv:
        yield srv


async def _code(coro) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await coro
    return exc.value.code()


async def test_otlp_auth(authed):
    ch = grpc.aio.insecure_channel(authed.address)
    stub = otlp_grpc.TraceServiceStub(ch)
    req = request(model_span("x", trace_id_of(1)))
    assert await _code(stub.Export(req)) is grpc.StatusCode.UNAUTHENTICATED
    bad = (("authorization", "Bearer nope"),)
    assert await _code(stub.Export(req, metadata=bad)) is grpc.StatusCode.UNAUTHENTICATED
    ok = (("authorization", "Bearer acme-secret"),)
    resp = await stub.Export(req, metadata=ok)
    assert resp.partial_success.rejected_spans == 0
    await ch.close()


async def test_tenant_token_cannot_touch_other_tenant(authed):
    acme, globex = await two_tenants(authed.address)
    # globex exports spans for acme's run: answered like an unknown run's, acme untouched
    resp = await globex.export(model_span("a1", trace_id_of(2), tokens_in=999))
    assert resp.partial_success.rejected_spans == 0
    assert authed.registry.runs["a1"].budget.usage().input_tokens == 0

    def admin(token):
        return AdminClient(authed.address, token=token)

    with admin("globex-secret") as c:
        with pytest.raises(InvalidInput, match="NOT_FOUND"):  # as for an unknown id
            await asyncio.to_thread(c.cancel, run_id="a1")
        with pytest.raises(AuthError, match="PERMISSION_DENIED"):
            await asyncio.to_thread(c.cancel, tenant="acme")
        with pytest.raises(AuthError, match="PERMISSION_DENIED"):
            await asyncio.to_thread(c.cancel, all=True)
        with pytest.raises(AuthError, match="PERMISSION_DENIED"):
            await asyncio.to_thread(c.list_runs, tenant="acme")
        listed = await asyncio.to_thread(c.list_runs)
        assert [r.run_id for r in listed.runs] == ["g1"]
        assert await asyncio.to_thread(c.cancel, run_id="g1") == ["g1"]
    with admin(None) as c, pytest.raises(AuthError, match="UNAUTHENTICATED"):
        await asyncio.to_thread(c.list_runs)
    with admin("admin-secret") as c:
        assert {r.run_id for r in (await asyncio.to_thread(c.list_runs)).runs} == {"a1", "g1"}
    # a tenant token opening a stream as another tenant
    spoof = Agent(authed.address, token="globex-secret", tenant="acme")
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await spoof.connect()
    assert exc.value.code() is grpc.StatusCode.PERMISSION_DENIED
    for a in (acme, globex, spoof):
        await a.close()


async def test_control_stream_without_token(authed):
    agent = Agent(authed.address, token=None)
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await agent.connect()
    assert exc.value.code() is grpc.StatusCode.UNAUTHENTICATED
    await agent.close()


def test_no_auth_refuses_public_bind():
    with pytest.raises(ConfigError, match="insecure-bind-any"):
        GuardServer(config(), listen="0.0.0.0:0")
    GuardServer(config(), listen="0.0.0.0:0", insecure_bind_any=True)  # explicit opt-in
    GuardServer(config(auth=AUTH), listen="0.0.0.0:0", environ=AUTH_ENV)


async def test_malformed_and_oversized_otlp(sink):
    async with GuardServer(
        config(), listen="127.0.0.1:0", sink=sink, max_message_bytes=64 * 1024
    ) as srv:
        ch = grpc.aio.insecure_channel(srv.address)
        raw = ch.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await raw(b"\xff\xff\xff\x0f garbage")
        assert exc.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed OTLP" in exc.value.details()
        stub = otlp_grpc.TraceServiceStub(ch)
        big = request(*[model_span("r" * 200, trace_id_of(i)) for i in range(1000)])
        assert await _code(stub.Export(big)) is grpc.StatusCode.RESOURCE_EXHAUSTED
        # the guard keeps serving
        resp = await stub.Export(request(model_span("fine", trace_id_of(1))))
        assert resp.partial_success.rejected_spans == 0
        await ch.close()


async def test_bad_counters_get_partial_success_and_state_is_intact(guard):
    agent = Agent(guard.address)
    await agent.connect()
    tid = trace_id_of(4)
    await agent.start_run("r", tid)
    resp = await agent.export(
        model_span("r", tid, tokens_in=-1),
        model_span("r", tid, **{"guard.cost.usd": math.inf}),
        model_span("r", tid, tokens_in=10, tokens_out=1),
    )
    assert resp.partial_success.rejected_spans == 2
    assert guard.registry.runs["r"].budget.usage().input_tokens == 10
    await agent.close()


async def test_protocol_violations_end_the_stream_clearly(guard):
    ch = grpc.aio.insecure_channel(guard.address)
    stub = guard_pb2_grpc.GuardControlStub(ch)

    async def gen(*msgs):
        for m in msgs:
            yield m

    call = stub.Attach(gen(pb.AgentMessage(run_started=pb.RunStarted(run_id="x"))))
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        async for _ in call:
            pass
    assert exc.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "first message must be hello" in exc.value.details()
    # after the Hello, one bad message is refused on its own: the stream ends cleanly
    hello = pb.AgentMessage(hello=pb.Hello(process_id="p"))
    call = stub.Attach(gen(hello, pb.AgentMessage(run_started=pb.RunStarted(run_id=""))))
    got = [m async for m in call]
    [reject] = [m.reject for m in got if m.WhichOneof("body") == "reject"]
    assert reject.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "run_id is empty" in reject.reason
    await ch.close()


async def test_unknown_run_and_empty_selector(guard):
    with AdminClient(guard.address) as c:
        with pytest.raises(InvalidInput, match="NOT_FOUND"):
            await asyncio.to_thread(c.cancel, run_id="nope")
        with pytest.raises(InvalidInput):
            await asyncio.to_thread(c._call, "Cancel", pb.CancelRequest())


async def test_flood_of_runs_is_capped(sink):
    cfg = config(guard={"max_tracked_runs": 5})
    async with GuardServer(cfg, listen="127.0.0.1:0", sink=sink) as srv:
        agent = Agent(srv.address)
        await agent.connect()
        answers = [
            (await agent.start_run(f"r{i}", trace_id_of(100 + i))).WhichOneof("body")
            for i in range(8)
        ]
        assert answers == ["admit"] * 5 + ["deny"] * 3
        deny = agent.directives("deny")[0]
        assert "max_tracked_runs=5" in deny.detail
        # span-only runs beyond the cap are refused per span
        resp = await agent.export(model_span("implicit", trace_id_of(999)))
        assert resp.partial_success.rejected_spans == 1
        assert len(srv.registry.runs) == 5
        await agent.close()


async def test_report_without_store_is_unavailable(guard):
    with (
        AdminClient(guard.address) as c,
        pytest.raises(GuardUnavailable, match=r"UNAVAILABLE.*no store attached"),
    ):
        await asyncio.to_thread(c.report)


async def test_large_request_is_applied_in_chunks(guard):
    agent = Agent(guard.address)
    await agent.connect()
    tid = trace_id_of(5)
    await agent.start_run("big", tid)
    spans = [model_span("big", tid, tokens_in=1, tokens_out=0) for _ in range(5000)]
    resp = await agent.export(*spans)
    assert resp.partial_success.rejected_spans == 0
    usage = guard.registry.runs["big"].budget.usage()
    assert (usage.model_calls, usage.input_tokens) == (5000, 5000)
    await agent.close()


async def test_malformed_attribute_refuses_the_whole_request(guard):
    """Span attributes are validated while decoding: one bad one refuses the request (as a
    full parse would) and nothing of it is applied, not even the valid spans before it."""
    from opentelemetry.proto.common.v1 import common_pb2

    agent = Agent(guard.address)
    await agent.connect()
    tid = trace_id_of(6)
    await agent.start_run("m", tid)
    good = model_span("m", tid, tokens_in=7, tokens_out=1)
    bad_value = common_pb2.AnyValue(string_value="x").SerializeToString().replace(b"x", b"\xff")
    bad = b"\x0a\x0bhttp.method\x12" + bytes([len(bad_value)]) + bad_value
    data = raw_request(
        raw_span(good.name, tid, [kv.SerializeToString() for kv in good.attributes]),
        raw_span("GET /", tid, [bad]),
    )
    raw = agent.channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await raw(data)
    assert exc.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed OTLP" in exc.value.details()
    assert guard.registry.runs["m"].budget.usage().input_tokens == 0
    await agent.close()
