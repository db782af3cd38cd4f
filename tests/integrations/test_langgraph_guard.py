"""LangGraph with a real guard (``ServerThread`` on 127.0.0.1:0, records in a MemorySink): the
exact tokens of the termination record, the model calls after an operator cancel (≤ 1: the
one in flight), sync and async, and one count with a second reporter (OpenInference's
LangChain instrumentation)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from _lg import MODES, Lookup, chat, instrument, runaway, then_answer
from _llm_server import LLMServer
from _wait import wait_until
from langgraph.prebuilt import create_react_agent

import guard
from guard.cli._client import AdminClient
from guard.server import MemorySink, ServerThread

pytestmark = pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
LIMIT = {"recursion_limit": 400}


@pytest.fixture(params=list(MODES))
def instrumented(request: pytest.FixtureRequest) -> str:
    return instrument(request.param)


def _record(sink: MemorySink, run_id: str):
    assert sink.wait_for(lambda s: s.run(run_id) is not None, 10.0)
    return sink.run(run_id)


def test_exact_tokens_in_the_guards_record(llm: LLMServer, server, instrumented) -> None:
    _, sink = server
    llm.script = then_answer(2, input=1200, output=90, cached=200, reasoning=30)
    agent = create_react_agent(chat(llm), [Lookup().tool], name="refund-graph")
    out = agent.invoke({"messages": [("user", "refund A-1")]})  # outside a run: its own
    assert out["messages"][-1].content == "done"
    rec = sink.wait_for(lambda s: len(s.runs) == 1, 10.0) and sink.runs[0]
    assert (rec.agent, rec.status, rec.reason) == ("refund-graph", "completed", "final_answer")
    assert (rec.model_calls, rec.tool_calls, rec.steps) == (3, 2, 3)
    assert (rec.input_tokens, rec.output_tokens) == (3600, 270)
    assert (rec.cached_tokens, rec.reasoning_tokens) == (600, 90)


def test_exact_tokens_in_runstopped_and_the_record(llm: LLMServer, server, instrumented) -> None:
    _, sink = server
    llm.script = runaway(input=1000, output=100)
    agent = create_react_agent(chat(llm), [Lookup().tool])

    @guard.run(agent="budgeted", max_tokens=3000, loop={"repeat_threshold": 20})
    def handle() -> dict:
        return agent.invoke({"messages": [("user", "go")]}, LIMIT)

    with pytest.raises(guard.RunStopped) as stop:
        handle()
    out = stop.value.outcome
    assert out.reason == "token_budget" and "tokens=3300" in out.message
    rec = _record(sink, out.run_id)
    for o in (out, rec):
        assert (o.model_calls, o.input_tokens, o.output_tokens) == (3, 3000, 300)
    assert llm.count == 3


def _operator(srv: ServerThread, llm: LLMServer, state: dict) -> threading.Thread:
    """Once the held model call is in flight: cancel the run through GuardAdmin, wait for the
    cancel to reach the SDK, then let the call finish."""

    def go() -> None:
        gate = state["gate"]
        assert gate.arrived.wait(10.0)
        with AdminClient(srv.address) as admin:
            admin.cancel(run_id=state["run"].run_id, reason="stop that")
        state["at_cancel"] = llm.count
        try:
            wait_until(lambda: state["run"].cancelled, 10, "the cancel to reach the SDK")
            state["seen"] = True
        finally:
            gate.release()

    return threading.Thread(target=go, daemon=True)


@pytest.mark.parametrize("entry", ["invoke", "stream", "ainvoke", "astream"])
def test_at_most_one_model_call_after_a_guard_cancel(
    llm: LLMServer, server, instrumented, entry: str
) -> None:
    srv, sink = server
    llm.script = runaway()
    agent = create_react_agent(chat(llm), [Lookup().tool])
    state: dict = {}
    op = _operator(srv, llm, state)
    inp = {"messages": [("user", "go")]}
    loop = {"repeat_threshold": 20, "no_progress_steps": 20}

    def first_turns() -> None:  # two turns go through, the third is held at the server
        state["run"] = guard.current_run()
        state["gate"] = llm.hold()
        op.start()

    if entry in ("invoke", "stream"):

        @guard.run(agent="held", loop=loop)
        def handle() -> None:
            first_turns()
            if entry == "invoke":
                agent.invoke(inp, LIMIT)
            else:
                for _ in agent.stream(inp, LIMIT):
                    pass

        run = handle
    else:

        @guard.run(agent="held", loop=loop)
        async def ahandle() -> None:
            first_turns()
            if entry == "ainvoke":
                await agent.ainvoke(inp, LIMIT)
            else:
                async for _ in agent.astream(inp, LIMIT):
                    pass

        def run() -> None:
            asyncio.run(ahandle())

    with pytest.raises(guard.RunStopped) as stop:
        run()
    op.join(10.0)
    out = stop.value.outcome
    assert (out.status, out.reason) == ("cancelled", "operator_cancel")
    assert state.get("seen")
    # No model call started after the cancel: the one in flight (held at the server) is the
    # only one. Sync: it finished and was recorded; async: the run's task was cancelled, the
    # request cut before an answer (nothing to record).
    assert state["at_cancel"] == 1 and llm.count == 1
    assert out.model_calls == (1 if entry in ("invoke", "stream") else 0)
    rec = _record(sink, out.run_id)
    assert rec.reason == "operator_cancel" and rec.model_calls == out.model_calls


# OpenInference's LangChain instrumentation starts its LLM span in on_chat_model_start, before
# the integration's guarded call (and its inferred step) begins, with a parent of its own: the
# SDK's processor matches it to the call the integration recorded (RunCalls.integrated).
def test_counted_once_with_openinference_as_a_second_reporter(
    llm: LLMServer, server, instrumented
) -> None:
    oi = pytest.importorskip("openinference.instrumentation.langchain")
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    srv, sink = server
    # The application's pipeline carries every span to the guard: the SDK's own and
    # OpenInference's LLM spans (with their llm.token_count.* usage) of the same calls.
    tp = TracerProvider()
    tp.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=srv.address, insecure=True))
    )
    guard.configure(endpoint=srv.address, span_export="none", tracer_provider=tp)
    instrumentor = oi.LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=tp)
    try:
        llm.script = then_answer(1, input=500, output=50)
        agent = create_react_agent(chat(llm), [Lookup().tool], name="two-reporters")
        agent.invoke({"messages": [("user", "go")]})
    finally:
        instrumentor.uninstrument()
        tp.force_flush()
    rec = sink.wait_for(lambda s: len(s.runs) == 1, 10.0) and sink.runs[0]
    assert rec.agent == "two-reporters"
    assert (rec.model_calls, rec.input_tokens, rec.output_tokens) == (2, 1000, 100)
    sdk = guard.stats()  # OpenInference's two LLM spans were seen and matched, not dropped
    assert sdk.get("foreign_errors", 0) == 0 and sdk.get("foreign_duplicates", 0) >= 2, sdk
    stats = srv.call(lambda: dict(srv.server.registry.stats))
    print("guard stats:", {k: v for k, v in stats.items() if "model" in k})
