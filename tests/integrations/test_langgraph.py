"""LangChain and LangGraph with ``guard.instrument()``: the real libraries (langgraph,
langchain-openai's ChatOpenAI, the prebuilt ReAct agent) against the scripted local server,
local-only mode (the SDK enforces the policy itself). Each test fails without the integration:
the graph runs to its recursion limit, counts nothing, or a stop becomes a tool result."""

from __future__ import annotations

from typing import Any

import pytest
from _lg import MODES, Lookup, chat, instrument, runaway, then_answer, tool_messages, two_lookups
from _llm_server import LLMServer, text
from langchain_core.tools import tool as lc_tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, create_react_agent, tools_condition

import guard
from guard.integrations import _base

# create_react_agent moved to langchain.agents in LangGraph 1.0 and is still shipped here.
pytestmark = pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
LIMIT = {"recursion_limit": 400}  # the graph's own limit: far above where the guard stops


@pytest.fixture(params=list(MODES))
def instrumented(request: pytest.FixtureRequest) -> str:
    return instrument(request.param)


def _react_graph(model, tools):
    """A hand-built ReAct loop: a model node, a ToolNode, and the prebuilt tools_condition."""

    def call_model(state: MessagesState) -> dict:
        return {
            "messages": [model.bind_tools(tools.tools_by_name.values()).invoke(state["messages"])]
        }

    g = StateGraph(MessagesState)
    g.add_node("agent", call_model)
    g.add_node("tools", tools)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile(name="refund-graph")


def test_runaway_react_agent_stops_as_loop_detected(llm: LLMServer, instrumented: str) -> None:
    llm.script = runaway(input=100, output=10)
    lookup = Lookup()
    agent = create_react_agent(chat(llm), [lookup.tool])

    @guard.run(agent="refunds", max_steps=100)
    def handle() -> dict:
        return agent.invoke({"messages": [("user", "where is my refund?")]}, LIMIT)

    with pytest.raises(guard.RunStopped) as stop:
        handle()
    out = stop.value.outcome
    assert (out.status, out.reason) == ("terminated", "loop_detected")
    assert out.model_calls == llm.count  # every call that reached the server, once
    assert out.steps == llm.count  # one inferred step per model turn (with its tool)
    assert out.tool_calls == lookup.ran
    assert (out.input_tokens, out.output_tokens) == (100 * llm.count, 10 * llm.count)
    assert llm.count <= 8  # stopped early, not at the recursion limit


async def test_runaway_async_ainvoke_stops_as_loop_detected(
    llm: LLMServer, instrumented: str
) -> None:
    llm.script = runaway(input=100, output=10)
    lookup = Lookup()
    agent = create_react_agent(chat(llm), [lookup.tool])

    @guard.run(agent="refunds", max_steps=100)
    async def handle() -> dict:
        return await agent.ainvoke({"messages": [("user", "where is my refund?")]}, LIMIT)

    with pytest.raises(guard.RunStopped) as stop:
        await handle()
    out = stop.value.outcome
    assert out.reason == "loop_detected"
    assert out.model_calls == llm.count <= 8
    assert out.input_tokens == 100 * llm.count


@pytest.mark.parametrize("streaming", [False, True])
def test_token_budget_with_exact_tokens(llm: LLMServer, instrumented: str, streaming: bool) -> None:
    llm.script = runaway(input=300, output=40, cached=100, reasoning=15)
    lookup = Lookup()
    model = chat(llm, streaming=streaming, stream_usage=True)
    graph = _react_graph(model, ToolNode([lookup.tool]))

    @guard.run(agent="budgeted", max_tokens=1000, loop={"repeat_threshold": 20})
    def handle() -> dict:
        return graph.invoke({"messages": [("user", "go")]}, LIMIT)

    with pytest.raises(guard.RunStopped) as stop:
        handle()
    out = stop.value.outcome
    assert out.reason == "token_budget"
    assert "tokens=1020" in out.message  # 3 calls of 340: the third crosses 1000
    assert llm.count == 3 and out.model_calls == 3
    assert (out.input_tokens, out.output_tokens) == (900, 120)
    assert (out.cached_tokens, out.reasoning_tokens) == (300, 45)


def test_stream_and_astream_of_a_graph_stop(llm: LLMServer, instrumented: str) -> None:
    llm.script = runaway()
    lookup = Lookup()
    agent = create_react_agent(chat(llm), [lookup.tool])
    seen = []

    @guard.run(agent="streamer", max_steps=3, loop={"repeat_threshold": 20})
    def handle() -> None:
        for update in agent.stream({"messages": [("user", "go")]}, LIMIT, stream_mode="updates"):
            seen.append(update)

    with pytest.raises(guard.RunStopped) as stop:
        handle()
    assert stop.value.outcome.reason == "max_steps"
    assert llm.count == 3 and len(seen) == 6  # 3 model turns and their tools, then the stop


async def test_astream_outside_a_run_is_its_own_run(llm: LLMServer, instrumented: str) -> None:
    llm.script = runaway()
    graph = _react_graph(chat(llm), ToolNode([Lookup().tool]))
    chunks = 0
    with pytest.raises(guard.RunStopped) as stop:
        async for _ in graph.astream({"messages": [("user", "go")]}, LIMIT):
            chunks += 1
    out = stop.value.outcome
    assert (out.agent, out.reason) == ("refund-graph", "loop_detected")
    assert out.model_calls == llm.count and chunks > 0
    assert _base.active_run() is None  # the graph's run ended with its stream


def test_invoke_outside_a_run_is_a_run_named_after_the_graph(llm, instrumented, sink) -> None:
    llm.script = then_answer(1, input=50, output=5)
    graph = _react_graph(chat(llm), ToolNode([Lookup().tool]))
    result = graph.invoke({"messages": [("user", "go")]})
    assert result["messages"][-1].content == "done"
    (span,) = [s for s in sink.spans if s.name.startswith("invoke_agent")]
    assert span.name == "invoke_agent refund-graph"
    attrs = span.attributes
    assert (attrs["guard.stop.status"], attrs["guard.stop.reason"]) == ("completed", "final_answer")
    assert (attrs["guard.usage.steps"], attrs["guard.usage.tool_calls"]) == (2, 1)
    assert _tokens(sink, attrs["guard.run.id"]) == [(50, 5), (50, 5)]  # each call once


def _tokens(sink, run_id: str) -> list[tuple[int, int]]:
    """(input, output) tokens of each model-call span of the run."""
    return [
        (s.attributes["gen_ai.usage.input_tokens"], s.attributes["gen_ai.usage.output_tokens"])
        for s in sink.spans
        if s.attributes.get("gen_ai.operation.name") == "chat"
        and s.attributes.get("guard.run.id") == run_id
    ]


def test_a_graph_inside_a_run_attaches_to_it(llm, instrumented, sink) -> None:
    llm.script = then_answer(1)
    graph = _react_graph(chat(llm), ToolNode([Lookup().tool]))

    @guard.run(agent="outer")
    def handle() -> str:
        graph.invoke({"messages": [("user", "go")]})
        graph.invoke({"messages": [("user", "again")]})
        return guard.current_run().run_id

    run_id = handle()
    runs = [s for s in sink.spans if s.name.startswith("invoke_agent")]
    assert [s.name for s in runs] == ["invoke_agent outer"]  # no run of its own
    assert runs[0].attributes["guard.run.id"] == run_id
    assert _tokens(sink, run_id) == [(10, 5)] * 3  # 2 + 1 model calls, each counted once


def test_refused_tool_call_is_raised_not_a_tool_result(llm: LLMServer, instrumented: str) -> None:
    """ToolNode(handle_tool_errors=True) turns every tool exception into a ToolMessage; the
    guard's refusal (the tool quota, reached inside a batch of parallel calls) comes out of the
    graph instead: no tools update carries it, and the model never reads it."""
    llm.script = [two_lookups(), two_lookups()]
    lookup = Lookup()
    agent = create_react_agent(chat(llm), ToolNode([lookup.tool], handle_tool_errors=True))
    updates = []

    @guard.run(agent="quota", max_tool_calls=3, loop={"repeat_threshold": 20})
    def handle() -> None:
        for update in agent.stream({"messages": [("user", "go")]}, LIMIT, stream_mode="updates"):
            updates.append(update)

    with pytest.raises(guard.RunStopped) as stop:
        handle()
    assert stop.value.outcome.reason == "max_tool_calls"
    assert lookup.ran == 3  # the 4th call was refused before the tool ran
    assert llm.count == 2  # and the model never got a 3rd turn
    results = [m for u in updates for m in (u.get("tools") or {}).get("messages", [])]
    assert [m.content for m in results] == ["no such order"] * 3  # none is the refusal
    assert tool_messages(llm) == ["no such order"] * 2  # the first batch only


def test_plain_chat_model_calls_stop_after_a_cancel(llm: LLMServer, instrumented: str) -> None:
    llm.script = [text("hi", input=20, output=2)]
    model = chat(llm, stream_usage=True)

    @guard.run(agent="chatty")
    def handle() -> None:
        assert model.invoke("hello").content == "hi"
        assert "".join(c.content for c in model.stream("hello")) == "hi"
        guard.current_run().cancel()
        model.invoke("hello again")

    with pytest.raises(guard.RunStopped) as stop:
        handle()
    out = stop.value.outcome
    assert (out.status, out.reason) == ("cancelled", "user_cancel")
    assert llm.count == 2 and out.model_calls == 2  # nothing left after the cancel
    assert (out.input_tokens, out.output_tokens) == (40, 4)


async def test_plain_async_chat_model_calls_stop_after_a_cancel(llm, instrumented) -> None:
    llm.script = [text("hi", input=20, output=2)]
    model = chat(llm, stream_usage=True)

    @guard.run(agent="chatty")
    async def handle() -> None:
        assert (await model.ainvoke("hello")).content == "hi"
        assert "".join([c.content async for c in model.astream("hello")]) == "hi"
        guard.current_run().cancel()
        await model.ainvoke("hello again")

    with pytest.raises(guard.RunStopped) as stop:
        await handle()
    out = stop.value.outcome
    assert out.reason == "user_cancel"
    assert llm.count == 2 and out.model_calls == 2
    assert (out.input_tokens, out.output_tokens) == (40, 4)


def test_guard_side_failure_never_breaks_the_tool_call() -> None:
    """The fingerprinting of a tool's arguments fails (a self-referencing argument): the tool
    still runs and returns its result; the failure is logged and counted."""
    guard.instrument("langgraph")

    @lc_tool
    def inspect(thing: Any) -> str:
        """Inspect a thing."""
        return "inspected"

    before = _base.errors().get("admitting a tool call", 0)

    @guard.run(agent="odd")
    def handle() -> str:
        thing: dict = {}
        thing["self"] = thing
        return inspect.invoke({"thing": thing})

    assert handle() == "inspected"
    assert _base.errors()["admitting a tool call"] == before + 1


def test_a_model_used_before_instrument_is_still_counted_once(llm: LLMServer) -> None:
    """langchain-openai calls ``client.with_raw_response.create``, built at the model's first
    call: one made before ``guard.instrument()`` keeps the unwrapped ``create``, so the openai
    integration never sees its calls; they are counted here instead, once."""
    llm.script = [text("hi", input=10, output=1)]
    model = chat(llm)
    model.invoke("before")  # not guarded: no instrument() yet, no run
    guard.instrument()

    @guard.run(agent="early")
    def handle() -> Any:
        model.invoke("a")
        model.invoke("b")
        return guard.current_run().usage()

    u = handle()
    assert (u.model_calls, u.input_tokens, u.output_tokens) == (2, 20, 2)
    assert llm.count == 3


def test_uninstrument_restores_the_classes() -> None:
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.tools import BaseTool
    from langgraph.pregel import Pregel

    attrs = [(BaseChatModel, "_generate_with_cache"), (BaseTool, "run"), (Pregel, "stream")]
    before = [c.__dict__[a] for c, a in attrs]
    assert guard.instrument("langgraph") == ["langchain"]
    assert all(
        c.__dict__[a].__guard_original__ is b for (c, a), b in zip(attrs, before, strict=True)
    )
    assert guard.instrument("langgraph") == ["langchain"]  # idempotent: not wrapped twice
    guard.uninstrument()
    assert [c.__dict__[a] for c, a in attrs] == before


@pytest.mark.slow
def test_the_example_runs_against_the_local_server(llm: LLMServer) -> None:
    """examples/langgraph_agent.py as a user runs it: OPENAI_BASE_URL at the scripted server."""
    import itertools
    import os
    import subprocess
    import sys
    from pathlib import Path

    from _llm_server import tool

    n = itertools.count()

    def script(body: dict, api: str):
        msgs = body["messages"]
        if "1234" not in msgs[0]["content"]:  # order 9: new arguments, the same result
            return tool("lookup_order", {"order": f"9-{next(n)}"}, input=200, output=20)
        if msgs[-1]["role"] == "tool":
            return text("Your refund was issued.")
        return tool("lookup_order", {"order": "1234"})

    llm.script = script
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_GUARD_")}
    env.update(OPENAI_BASE_URL=llm.base_url, OPENAI_API_KEY="test")
    proc = subprocess.run(
        [sys.executable, str(root / "examples" / "langgraph_agent.py")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    happy, looping = proc.stdout.splitlines()
    assert happy.endswith("Your refund was issued.")
    assert "terminated loop_detected after 5 steps, 5 model calls, 1100 tokens" in looping
