"""LangGraph with langchain-anthropic's ``ChatAnthropic`` against the scripted server's
``/v1/messages``, with a real guard: every model call is counted once, with exact tokens in
``RunStopped.outcome`` and in the guard's record, whether the ``anthropic`` client layer counts
it (``guard.instrument()``: ChatAnthropic calls the guarded client) or the LangGraph layer does
(``guard.instrument("langchain")``, or a model whose client was built before the anthropic
integration was turned on)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from _lg import Lookup, runaway, then_answer
from _llm_server import LLMServer, text
from langgraph.prebuilt import create_react_agent

import guard
from guard.server import MemorySink

langchain_anthropic = pytest.importorskip("langchain_anthropic")
pytestmark = pytest.mark.filterwarnings("ignore:create_react_agent has been moved")

LIMIT = {"recursion_limit": 400}
# input 1200 = 900 fresh + 200 cache reads + 100 cache writes; output 90 with 30 of thinking
USAGE = {"input": 1200, "output": 90, "cached": 200, "cache_write": 100, "reasoning": 30}
# who counts: the anthropic client layer (all on), or the LangGraph layer alone
MODES = {"all": (), "langgraph-only": ("langchain",)}
ENTRIES = ("invoke", "ainvoke", "stream", "astream")


@pytest.fixture(params=list(MODES))
def mode(request: pytest.FixtureRequest, llm: LLMServer) -> str:
    names = guard.instrument(*MODES[request.param])
    assert "langchain" in names and ("anthropic" in names) == (request.param == "all")
    # LangChain's ChatAnthropic reads a stream's usage from message_delta alone: the LangGraph
    # layer counts exactly when that carries the input counts too (the anthropic client layer
    # reads message_start, and is exact either way)
    llm.anthropic_full_delta = request.param == "langgraph-only"
    return request.param


def chat(llm: LLMServer, max_tokens: int = 1024, **kw: Any) -> Any:
    return langchain_anthropic.ChatAnthropic(
        model="claude-sonnet-4-5",
        base_url=llm.anthropic_base_url,
        api_key="test",
        max_retries=0,
        max_tokens=max_tokens,
        **kw,
    )


def _drive(agent: Any, entry: str, inp: dict[str, Any]) -> Any:
    """One graph run by ``entry``; ``stream_mode="messages"`` makes the model stream."""
    if entry == "invoke":
        return agent.invoke(inp, LIMIT)
    if entry == "stream":
        return list(agent.stream(inp, LIMIT, stream_mode="messages"))
    if entry == "ainvoke":
        return asyncio.run(agent.ainvoke(inp, LIMIT))

    async def drain() -> list[Any]:
        return [c async for c in agent.astream(inp, LIMIT, stream_mode="messages")]

    return asyncio.run(drain())


def _record(sink: MemorySink, run_id: str | None = None) -> Any:
    if run_id is None:
        assert sink.wait_for(lambda s: len(s.runs) == 1, 10.0)
        return sink.runs[0]
    assert sink.wait_for(lambda s: s.run(run_id) is not None, 10.0)
    return sink.run(run_id)


def _tokens(o: Any) -> tuple[int, int, int, int, int]:
    return (o.model_calls, o.input_tokens, o.output_tokens, o.cached_tokens, o.reasoning_tokens)


@pytest.mark.parametrize("entry", ENTRIES)
def test_each_call_counted_once_with_exact_tokens_in_the_record(
    llm: LLMServer, server, mode: str, entry: str
) -> None:
    _, sink = server
    llm.script = then_answer(2, **USAGE)
    agent = create_react_agent(chat(llm), [Lookup().tool], name="claude-graph")
    _drive(agent, entry, {"messages": [("user", "refund A-1")]})  # outside a run: its own
    assert llm.count == 3
    rec = _record(sink)
    assert (rec.agent, rec.status, rec.reason) == ("claude-graph", "completed", "final_answer")
    assert _tokens(rec) == (3, 3600, 270, 600, 90)
    assert (rec.tool_calls, rec.steps) == (2, 3)


@pytest.mark.parametrize("entry", ["invoke", "astream"])
def test_token_budget_stops_at_the_same_call_with_exact_tokens(
    llm: LLMServer, server, mode: str, entry: str
) -> None:
    _, sink = server
    llm.script = runaway(input=1000, output=100)
    # each call reserves its prompt (a few hundred tokens, the tool-use preamble included) and
    # its max_tokens (100) before it leaves: the third one fits the 800 left
    agent = create_react_agent(chat(llm, max_tokens=100), [Lookup().tool])

    @guard.run(agent="budgeted", max_tokens=3000, loop={"repeat_threshold": 20})
    def handle() -> Any:
        return _drive(agent, entry, {"messages": [("user", "go")]})

    with pytest.raises(guard.RunStopped) as stop:
        handle()
    out = stop.value.outcome
    # counted twice, the budget would stop after the second call with tokens=4400
    assert out.reason == "token_budget" and "tokens=3300" in out.message, out.message
    assert llm.count == 3
    for o in (out, _record(sink, out.run_id)):
        assert _tokens(o) == (3, 3000, 300, 0, 0)


def test_a_model_whose_client_predates_the_integration_is_counted_once(
    llm: LLMServer, server
) -> None:
    """A ChatAnthropic that made its first call before ``guard.instrument()`` keeps a raw
    response wrapper of the unwrapped ``create``: the LangGraph layer counts it instead."""
    _, sink = server
    model = chat(llm)
    llm.script = [text("hi", input=10, output=5), *then_answer(1, **USAGE)]
    model.invoke("warm up")  # builds the model's client and its with_raw_response
    assert "anthropic" in guard.instrument()
    agent = create_react_agent(model, [Lookup().tool], name="early-model")
    agent.invoke({"messages": [("user", "go")]})
    assert _tokens(_record(sink)) == (2, 2400, 180, 400, 60)


@pytest.mark.parametrize("entry", ["invoke", "astream"])
def test_a_model_with_betas_calls_beta_messages_and_is_counted_once(
    llm: LLMServer, server, mode: str, entry: str
) -> None:
    """With betas set, ChatAnthropic calls ``client.beta.messages``, guarded like ``messages``."""
    _, sink = server
    llm.script = then_answer(1, **USAGE)
    model = chat(llm, betas=["token-efficient-tools-2025-02-19"])
    agent = create_react_agent(model, [Lookup().tool], name="beta-graph")
    _drive(agent, entry, {"messages": [("user", "go")]})
    assert llm.count == 2
    assert _tokens(_record(sink)) == (2, 2400, 180, 400, 60)
