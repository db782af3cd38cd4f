"""Hostile input is contained (issue 11 §3): each case measured on the old code, against a real
guard on 127.0.0.1:0. Every bad value gets INVALID_ARGUMENT / RESOURCE_EXHAUSTED with a
one-line reason, changes nothing, never UNKNOWN, and logs no traceback."""

from __future__ import annotations

import asyncio
import logging
import math

import grpc
import pytest
from _wait import wait_until_async
from grpc_health.v1 import health_pb2

from guard.bounds import MAX_ID_CHARS, MAX_RUNS_PER_MESSAGE
from guard.server import GuardServer
from guard.v1 import guard_pb2 as pb

from .conftest import AUTH, AUTH_ENV, Agent, config, model_span, span, trace_id_of, two_tenants

COST = {"acme": {"rolling": [{"metric": "cost_usd", "limit": 5.0, "window_s": 3600}]}}


@pytest.fixture
def errors_logged(caplog):
    """Every ERROR (or traceback) logged by the guard or grpc during the test."""
    caplog.set_level(logging.WARNING)

    def bad():
        return [
            r
            for r in caplog.records
            if (r.levelno >= logging.ERROR or r.exc_info) and r.name.startswith(("guard", "grpc"))
        ]

    return bad


async def test_hello_restores_counters_in_constant_time_and_is_bounded(guard):
    """300 live runs of 1e9 steps restore exactly (the old loop stopped at 100k per run, after
    holding the event loop for 40 s); one more run than the bound refuses the whole Hello."""
    steps = 10**9
    live = [
        pb.RunStarted(run_id=f"h{i}", tenant="acme", usage=pb.Usage(steps=steps, model_calls=5))
        for i in range(300)
    ]
    agent = Agent(guard.address)
    await agent.connect(live_runs=live)
    await agent.wait_for(lambda m: m.WhichOneof("body") == "admit" and m.admit.run_id == "h299")
    usage = guard.registry.runs["h7"].budget.usage()
    assert (usage.steps, usage.model_calls) == (steps, 5)
    await agent.close()

    flood = [pb.RunStarted(run_id=f"f{i}") for i in range(MAX_RUNS_PER_MESSAGE + 1)]
    agent = Agent(guard.address)
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await agent.connect(live_runs=flood)
    assert exc.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"max {MAX_RUNS_PER_MESSAGE} per message" in exc.value.details()
    assert not any(r.startswith("f") for r in guard.registry.runs)  # nothing applied
    await agent.close()


async def test_a_bad_live_run_of_a_hello_is_refused_on_its_own(guard):
    """Its RunStarted gets a Reject after the Welcome; the other live runs are registered."""
    live = [
        pb.RunStarted(run_id="ok1"),
        pb.RunStarted(run_id="x" * (MAX_ID_CHARS + 1), request_id=4),
        pb.RunStarted(run_id="ok2"),
    ]
    agent = Agent(guard.address)
    await agent.connect(live_runs=live)
    found = await agent.wait_for(lambda m: m.WhichOneof("body") == "reject")
    assert found.reject.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert (found.reject.body, found.reject.request_id) == ("run_started", 4)
    assert len(found.reject.run_id) == MAX_ID_CHARS
    await wait_until_async(lambda: {"ok1", "ok2"} <= set(guard.registry.runs))
    assert agent.error is None
    await agent.close()


@pytest.mark.parametrize(
    ("outcome", "code", "text"),
    [
        ({"status": "exploded"}, grpc.StatusCode.INVALID_ARGUMENT, "outcome.status"),
        ({"run_id": "r" * 8_000}, grpc.StatusCode.RESOURCE_EXHAUSTED, "outcome.run_id"),
        ({"message": "m" * 100_000}, grpc.StatusCode.RESOURCE_EXHAUSTED, "outcome.message"),
        (
            {"usage": pb.Usage(cost_usd=1e300)},
            grpc.StatusCode.INVALID_ARGUMENT,
            "usage.cost_usd",
        ),
        (
            {"usage": pb.Usage(input_tokens=2**63)},
            grpc.StatusCode.INVALID_ARGUMENT,
            "usage.input_tokens",
        ),
    ],
)
async def test_run_ended_out_of_bounds_is_refused(guard, sink, outcome, code, text):
    """Refused on its own (a Reject in the stream, the stream goes on), never written as a
    run; out-of-bounds timestamps are mended instead (test_record_rejects)."""
    agent = Agent(guard.address)
    await agent.connect()
    kw = {"run_id": "e1", "status": "completed", "reason": "final_answer", **outcome}
    msg = pb.AgentMessage(run_ended=pb.RunEnded(outcome=pb.Outcome(**kw)))
    await agent.outbox.put(msg)
    found = await agent.wait_for(lambda m: m.WhichOneof("body") == "reject")
    assert found.reject.code == code.value[0]
    assert text in found.reject.reason and "\n" not in found.reject.reason
    assert sink.runs == [] and len(sink.dead_letters) == 1
    assert agent.error is None
    await agent.close()


async def test_run_started_out_of_bounds_is_refused(guard):
    """Refused on its own (a Reject in the stream); an agent clock out of bounds is mended
    instead (the run is admitted with the guard's receive time as its start)."""
    agent = Agent(guard.address)
    await agent.connect()
    await agent.outbox.put(
        pb.AgentMessage(run_started=pb.RunStarted(run_id="s1", trace_id="zz", request_id=7))
    )
    found = await agent.wait_for(lambda m: m.WhichOneof("body") == "reject")
    assert found.reject.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert (found.reject.run_id, found.reject.request_id) == ("s1", 7)
    assert "trace_id" in found.reject.reason
    assert "s1" not in guard.registry.runs
    await agent.outbox.put(
        pb.AgentMessage(run_started=pb.RunStarted(run_id="s2", started_at_unix=math.inf))
    )
    await agent.wait_for(lambda m: m.WhichOneof("body") == "admit" and m.admit.run_id == "s2")
    assert agent.error is None
    await agent.close()


async def test_huge_costs_never_reach_a_window(sink):
    async with GuardServer(config(tenants=COST), listen="127.0.0.1:0", sink=sink) as srv:
        agent = Agent(srv.address)
        await agent.connect()
        tid = trace_id_of(1)
        await agent.start_run("c1", tid)
        resp = await agent.export(
            model_span("c1", tid, **{"guard.cost.usd": 1e308}),
            model_span("c1", tid, **{"guard.cost.usd": 1e308}),
        )
        assert resp.partial_success.rejected_spans == 2
        assert "USD per span" in resp.partial_success.error_message
        window = srv.registry.budgets.status("acme").windows[0]
        assert window.used == 0.0
        assert srv.registry.runs["c1"].budget.usage().cost_usd in (None, 0.0)
        # the next run of the tenant is admitted, not "cost_usd inf reached its limit"
        assert (await agent.start_run("c2", trace_id_of(2))).WhichOneof("body") == "admit"
        await agent.close()


async def test_foreign_span_in_another_tenants_trace_is_not_a_type_error(sink):
    """A span without guard.run.id in a trace owned by another tenant's run used to answer
    UNKNOWN (TypeError) after charging the runs before it (half-applied)."""
    cfg = config(auth=AUTH)
    async with GuardServer(cfg, listen="127.0.0.1:0", sink=sink, environ=AUTH_ENV) as srv:
        acme, globex = await two_tenants(srv.address)
        foreign = span(  # in acme's trace
            "chat gpt-4.1",
            trace_id_of(2),
            {"gen_ai.usage.input_tokens": 50, "gen_ai.usage.output_tokens": 5},
        )
        resp = await globex.export(model_span("g1", trace_id_of(3), tokens_in=7), foreign)
        assert resp.partial_success.rejected_spans == 0
        assert srv.registry.runs["a1"].budget.usage().input_tokens == 0
        assert srv.registry.runs["g1"].budget.usage().input_tokens == 7
        assert srv.registry.budgets.status("globex").tenant == "globex"
        for a in (acme, globex):
            await a.close()


async def test_undecodable_bodies_are_invalid_argument_without_traceback(guard, errors_logged):
    ch = grpc.aio.insecure_channel(guard.address)
    garbage = b"\xff\xff\xff\xff\x0f not a protobuf"
    for method in (
        "/guard.v1.GuardAdmin/Cancel",
        "/guard.v1.GuardAdmin/ListRuns",
        "/guard.v1.GuardAdmin/Report",
        "/guard.v1.GuardAdmin/Stats",
        "/grpc.health.v1.Health/Check",
    ):
        call = ch.unary_unary(method)
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await call(garbage)
        assert exc.value.code() is grpc.StatusCode.INVALID_ARGUMENT, method
        assert "undecodable" in exc.value.details()
    watch = ch.unary_stream("/grpc.health.v1.Health/Watch")
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        async for _ in watch(garbage):
            pass
    assert exc.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    attach = ch.stream_stream("/guard.v1.GuardControl/Attach")
    hello = pb.AgentMessage(hello=pb.Hello(process_id="p")).SerializeToString()

    async def frames():
        yield hello
        yield garbage

    with pytest.raises(grpc.aio.AioRpcError) as exc:
        async for _ in attach(frames()):
            pass
    assert exc.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "undecodable" in exc.value.details()
    # still serving
    check = ch.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )
    assert (await check(health_pb2.HealthCheckRequest())).status == 1
    await asyncio.sleep(0)
    assert errors_logged() == []
    await ch.close()


async def test_report_with_non_finite_bounds_is_invalid_argument(guard):
    ch = grpc.aio.insecure_channel(guard.address)
    report = ch.unary_unary(
        "/guard.v1.GuardAdmin/Report",
        request_serializer=pb.ReportRequest.SerializeToString,
        response_deserializer=pb.ReportResponse.FromString,
    )
    for req in (pb.ReportRequest(since_unix=math.nan), pb.ReportRequest(until_unix=math.inf)):
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await report(req)
        assert exc.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    await ch.close()


async def test_stats_reports_loop_lag_to_the_admin_only(sink):
    cfg = config(auth=AUTH)
    async with GuardServer(cfg, listen="127.0.0.1:0", sink=sink, environ=AUTH_ENV) as srv:
        ch = grpc.aio.insecure_channel(srv.address)
        stats = ch.unary_unary(
            "/guard.v1.GuardAdmin/Stats",
            request_serializer=pb.StatsRequest.SerializeToString,
            response_deserializer=pb.StatsResponse.FromString,
        )
        admin = (("authorization", "Bearer admin-secret"),)

        async def sampled() -> pb.StatsResponse | None:
            resp = await stats(pb.StatsRequest(), metadata=admin)
            return resp if resp.figures["loop_lag_samples"] >= 2 else None

        resp = await wait_until_async(sampled, 10, "2 loop-lag samples in Stats")
        assert resp.guard_id == srv.guard_id
        for name in ("loop_lag_max_ms", "loop_lag_p99_ms", "runs_tracked", "spans"):
            assert name in resp.figures and math.isfinite(resp.figures[name])
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await stats(pb.StatsRequest(), metadata=(("authorization", "Bearer acme-secret"),))
        assert exc.value.code() is grpc.StatusCode.PERMISSION_DENIED
        await ch.close()


def test_agent_side_cuts_long_texts_to_what_the_guard_accepts():
    """A long exception text or tool name must never make a record the guard refuses (the
    agent would resend it after every reconnect)."""
    from guard.policy import Outcome
    from guard.wire import outcome_from_pb, outcome_to_pb

    outcome = Outcome(
        run_id="r", status="failed", reason="error", message="e" * 100_000, last_tool="t" * 999
    )
    back = outcome_from_pb(outcome_to_pb(outcome))
    assert len(back.message) == 4096 and len(back.last_tool) == MAX_ID_CHARS


@pytest.mark.parametrize(
    "fields",
    [{"run_id": ""}, {"cost_usd": math.nan}, {"cost_usd": 1e300}, {"tokens": 2**63}],
)
def test_allowance_request_bounds(fields):
    from guard.errors import InvalidInput
    from guard.wire import check_allowance_request

    req = pb.AllowanceRequest(**{"run_id": "r", "cost_usd": 0.5, "tokens": 10, **fields})
    with pytest.raises(InvalidInput):
        check_allowance_request(req)
    check_allowance_request(pb.AllowanceRequest(run_id="r", cost_usd=0.5, tokens=10))
