"""GuardControl + OTLP on a real grpc.aio server: admission, decisions, acks, lifecycle."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from _wait import wait_until_async

from guard.policy import DecidedBy, Reason, Status
from guard.server import GuardServer

from .conftest import Agent, config, model_span, step_span, tool_span, trace_id_of


async def test_admit_carries_tightest_limits(sink):
    cfg = config(runs={"max_steps": 20, "max_cost_usd": 1.0})
    async with GuardServer(cfg, listen="127.0.0.1:0", sink=sink) as srv:
        agent = Agent(srv.address)
        welcome = await agent.connect()
        assert welcome.policy.run_defaults.max_steps == 20
        msg = await agent.start_run("r1", trace_id_of(1), requested={"max_steps": 8})
        assert msg.WhichOneof("body") == "admit"
        eff = msg.admit.effective
        assert eff.max_steps == 8 and eff.max_cost_usd == pytest.approx(1.0)
        await agent.close()


async def test_loop_run_is_cancelled_and_decision_records_latency(sink):
    async with GuardServer(config(), listen="127.0.0.1:0", sink=sink) as srv:
        agent = Agent(srv.address)
        await agent.connect()
        tid = trace_id_of(2)
        await agent.start_run("loop", tid)
        for i in range(1, 6):
            await agent.export(tool_span("loop", tid, "ab" * 16), step_span("loop", tid, i))
            if agent.directives("cancel", "loop"):
                break
        msg = await agent.wait_for(lambda m: m.WhichOneof("body") == "cancel")
        assert msg.cancel.reason == "loop_detected"
        await wait_until_async(lambda: any(d.action == "cancel" for d in sink.decisions))
        rec = next(d for d in sink.decisions if d.action == "cancel")
        assert rec.reason == "loop_detected" and rec.delivery_latency_ms is not None
        assert rec.delivery_latency_ms >= 0
        await agent.end_run("loop", status="terminated", reason="loop_detected", decided_by="guard")
        await wait_until_async(lambda: sink.run("loop") is not None)
        assert sink.run("loop").decided_by is DecidedBy.GUARD
        assert "loop" not in srv.registry.runs
        await agent.close()


async def test_soft_thresholds_warn_then_wrap_up(sink):
    cfg = config(runs={"max_tokens": 1000})
    async with GuardServer(cfg, listen="127.0.0.1:0", sink=sink) as srv:
        agent = Agent(srv.address)
        await agent.connect()
        tid = trace_id_of(3)
        await agent.start_run("soft", tid)
        await agent.export(model_span("soft", tid, tokens_in=700, tokens_out=10))
        warn = await agent.wait_for(lambda m: m.WhichOneof("body") == "warn")
        await agent.export(model_span("soft", tid, tokens_in=150, tokens_out=50))
        wrap = await agent.wait_for(lambda m: m.WhichOneof("body") == "wrap_up")
        assert warn.command_id < wrap.command_id
        assert wrap.wrap_up.utilisation >= 0.9
        assert not agent.directives("cancel")
        await agent.export(model_span("soft", tid, tokens_in=200, tokens_out=0))
        cancel = await agent.wait_for(lambda m: m.WhichOneof("body") == "cancel")
        assert cancel.cancel.reason == "token_budget"
        await agent.close()


async def test_foreign_spans_count_once(sink):
    async with GuardServer(config(), listen="127.0.0.1:0", sink=sink) as srv:
        agent = Agent(srv.address)
        await agent.connect()
        tid = trace_id_of(4)
        await agent.start_run("f1", tid)
        from .conftest import span

        ours = model_span("f1", tid, tokens_in=100, tokens_out=10)
        # an OpenLLMetry-style child of our chat span, previous spelling: not counted again
        child = span(
            "openai.chat",
            tid,
            {
                "gen_ai.system": "openai",
                "gen_ai.usage.prompt_tokens": 100,
                "gen_ai.usage.completion_tokens": 10,
            },
            parent=ours.span_id,
        )
        # a foreign call of its own (OpenInference spelling): counted
        other = span("llm", tid, {"llm.token_count.prompt": 40, "llm.token_count.completion": 4})
        await agent.export(child, ours, other)
        usage = srv.registry.runs["f1"].budget.usage()
        assert usage.model_calls == 2
        assert usage.input_tokens == 140 and usage.output_tokens == 14
        assert srv.registry.stats["duplicate_model_calls"] == 1
        await agent.close()


async def test_a_sibling_report_of_another_instrumentation_counts_once(sink):
    """Spans the application's own pipeline delivers (no in-process matching): OpenInference's
    LLM span (no response id) next to our model span under the same step, or under the step
    before (its wrapper ran first), is the same call, in either order; two real calls with the
    same counts, each reported twice, still count twice; a report with other counts or
    another response id is a call."""
    from .conftest import span

    async with GuardServer(config(), listen="127.0.0.1:0", sink=sink) as srv:
        agent = Agent(srv.address)
        await agent.connect()
        tid = trace_id_of(14)
        await agent.start_run("s1", tid)
        step = b"\x05" * 8

        def ours(n: int, resp: str):
            extra = {"gen_ai.response.id": resp}
            return span(
                "chat m", tid, _usage("s1", 100, 10, extra), span_id=bytes([n]) * 8, parent=step
            )

        def theirs(n: int, inp: int = 100, extra: dict | None = None, parent: bytes = step):
            attrs = {
                "llm.token_count.prompt": inp,
                "llm.token_count.completion": 10,
                **(extra or {}),
            }
            return span("ChatCompletion", tid, attrs, span_id=bytes([n + 100]) * 8, parent=parent)

        await agent.export(ours(1, "r1"), theirs(1))  # ours first
        await agent.export(theirs(2))  # theirs first ...
        await agent.export(ours(2, "r2"))  # ... then ours
        await agent.export(ours(3, "r3"), ours(4, "r4"), theirs(3), theirs(4))  # two real calls
        await agent.export(theirs(5, inp=99))  # other counts: a call of its own
        await agent.export(ours(6, "r6"), theirs(6, extra={"gen_ai.response.id": "rX"}))
        await agent.export(theirs(7, parent=b"\x04" * 8), ours(7, "r7"))  # the step before
        usage = srv.registry.runs["s1"].budget.usage()
        assert usage.model_calls == 4 + 1 + 2 + 1
        assert srv.registry.stats["duplicate_model_calls"] == 5
        await agent.close()


async def test_agent_lost_after_grace(sink):
    cfg = config(guard={"agent_grace_s": 0.3})
    async with GuardServer(cfg, listen="127.0.0.1:0", sink=sink) as srv:
        agent = Agent(srv.address)
        await agent.connect()
        await agent.start_run("gone", trace_id_of(5))
        await agent.channel.close()  # the process dies
        outcome = await wait_until_async(lambda: sink.run("gone"), 10, "gone's agent_lost record")
        assert (outcome.status, outcome.reason) == (Status.FAILED, Reason.AGENT_LOST)
        assert outcome.decided_by is DecidedBy.GUARD
        assert "gone" not in srv.registry.runs


async def test_reconnect_after_guard_restart_re_registers_live_runs(sink):
    from guard.v1 import guard_pb2 as pb

    srv = await GuardServer(config(), listen="127.0.0.1:0", sink=sink).start()
    port = srv.port
    agent = Agent(srv.address)
    await agent.connect()
    await agent.start_run("live", trace_id_of(6))
    await srv.stop(drain_s=1.0)
    assert agent.error is not None or (await _errored(agent))
    assert agent.error.code() is grpc.StatusCode.UNAVAILABLE
    await agent.close()
    assert sink.run("live") is None  # a drain never ends a run

    srv2 = await GuardServer(config(), listen=f"127.0.0.1:{port}", sink=sink).start()
    try:
        again = Agent(srv2.address)
        usage = pb.Usage(steps=3, model_calls=2, input_tokens=500, output_tokens=20)
        live = pb.RunStarted(
            run_id="live", trace_id=trace_id_of(6).hex(), tenant="acme", usage=usage
        )
        await again.connect(live_runs=[live])
        await again.wait_for(lambda m: m.WhichOneof("body") == "admit")
        run = srv2.registry.runs["live"]
        assert run.connected and run.budget.usage().steps == 3
        assert run.budget.usage().input_tokens == 500
        await again.close()
    finally:
        await srv2.stop(drain_s=1.0)


async def _errored(agent: Agent) -> bool:
    return await wait_until_async(lambda: agent.error is not None, 10, "the stream's error")


async def test_operator_cancel_by_tenant(sink):
    from guard.cli._client import AdminClient

    async with GuardServer(config(), listen="127.0.0.1:0", sink=sink) as srv:
        a, b = Agent(srv.address, tenant="acme"), Agent(srv.address, tenant="globex")
        await a.connect()
        await b.connect(process_id="p2")
        await a.start_run("a1", trace_id_of(7))
        await b.start_run("b1", trace_id_of(8))
        client = AdminClient(srv.address)
        ids = await asyncio.to_thread(client.cancel, tenant="acme", reason="incident 42")
        assert ids == ["a1"]
        msg = await a.wait_for(lambda m: m.WhichOneof("body") == "cancel")
        assert msg.cancel.reason == "operator_cancel" and msg.cancel.detail == "incident 42"
        assert not b.directives("cancel")
        runs = await asyncio.to_thread(client.list_runs)
        assert {r.run_id for r in runs.runs} == {"a1", "b1"}
        client.close()
        await a.close()
        await b.close()


def _usage(run_id: str, inp: int, out: int, extra: dict) -> dict:
    return {
        "guard.run.id": run_id,
        "gen_ai.operation.name": "chat",
        "gen_ai.usage.input_tokens": inp,
        "gen_ai.usage.output_tokens": out,
        **extra,
    }
