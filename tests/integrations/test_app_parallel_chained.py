"""Two shapes of a run's calls that the guard must count one for one:

* three parallel tool calls in one Agents SDK turn (``get_eta``, ``get_price``, ``get_stock``
  asked for in one reply), twice: each call is counted once and fed to loop detection once,
  under its own name and call id; also when the tools are ``@guard.tool`` functions wrapped by
  ``function_tool`` (the code records them itself);
* a ``previous_response_id`` chain on the plain openai client (responses API): each request
  carries only the new ``function_call_output`` items, the calls themselves being on the
  server, named by the previous response. The same ``lookup({"q": "x"})`` asked for every
  time, with the same result, is a loop: stopped ``loop_detected`` at the third identical call,
  before the fourth request leaves.
"""

from __future__ import annotations

import asyncio
import collections
import json
from typing import Any

import openai
import pytest
from _llm_server import Reply, Usage, text, tool

import guard
from guard.testing import capture_spans

agents = pytest.importorskip("agents")
from agents import (  # noqa: E402
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

TOOLS = ("get_eta", "get_price", "get_stock")
ARGS = {"get_eta": {"sku": "K-9"}, "get_price": {"sku": "K-9"}, "get_stock": {"sku": "K-9"}}
ANSWERS = {"get_eta": "2 days", "get_price": "$19", "get_stock": "12 in stock"}
# The three overlap, and finish in the reverse of the order they were asked for.
DELAY_S = {"get_eta": 0.06, "get_price": 0.03, "get_stock": 0.0}


def _tool_results(body: dict[str, Any], api: str) -> int:
    if api == "chat":
        return sum(1 for m in body.get("messages") or () if m.get("role") == "tool")
    items = body.get("input")
    if not isinstance(items, list):
        return 0
    return sum(1 for it in items if it.get("type") == "function_call_output")


def batch_model(body: dict[str, Any], api: str) -> Reply:
    """The same batch of three calls (new call ids) on turns 1 and 2, then an answer."""
    if _tool_results(body, api) < 2 * len(TOOLS):
        calls = tuple(tool(name, ARGS[name]).tool_calls[0] for name in TOOLS)
        return Reply(tool_calls=calls, usage=Usage(input=60, output=15))
    return text("K-9: $19, 12 in stock, arrives in 2 days.", input=90, output=12)


def _tools(ran: list[str], recorded_by_code: bool) -> list[Any]:
    """Three async function tools; ``recorded_by_code``: each is a ``@guard.tool`` wrapped by
    ``function_tool`` (the code records each call itself)."""

    def make(name: str) -> Any:
        async def impl(sku: str) -> str:
            ran.append(name)
            await asyncio.sleep(DELAY_S[name])
            return ANSWERS[name]

        impl.__name__ = name
        impl.__doc__ = f"The {name[4:]} of a product."
        return function_tool(guard.tool(impl) if recorded_by_code else impl)

    return [make(n) for n in TOOLS]


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("kind", ["function_tool", "guard.tool"])
def test_three_parallel_tool_calls_per_turn_are_each_counted_once(llm, server, kind, api) -> None:
    srv, store = server
    guard.instrument()
    llm.script = batch_model
    ran: list[str] = []
    tools = _tools(ran, recorded_by_code=kind != "function_tool")
    client = openai.AsyncOpenAI(base_url=llm.base_url, api_key="test", max_retries=0)
    cls = OpenAIChatCompletionsModel if api == "chat" else OpenAIResponsesModel
    agent = Agent(
        name="shop",
        instructions="Answer about the product.",
        tools=tools,
        model=cls(model="gpt-4.1", openai_client=client),
    )
    run_ids: list[str] = []

    @guard.run(agent="shop")
    async def ask() -> str:
        run_ids.append(guard.current_run().run_id)
        return (await Runner.run(agent, "tell me about K-9")).final_output

    set_tracing_disabled(True)
    try:
        with capture_spans(endpoint=srv.address, hmac_key=b"test-key-0123456789") as spans:
            try:
                answer = asyncio.run(ask())
            except guard.RunStopped as stop:
                o = stop.outcome
                pytest.fail(
                    f"stopped: {o.reason} ({o.message}); tool_calls {o.tool_calls}; "
                    f"execute_tool spans: {_tool_spans(spans)}"
                )
            guard.shutdown()  # the record acknowledged
            seen = _tool_spans(spans)
    finally:
        set_tracing_disabled(False)
    assert answer.startswith("K-9") and sorted(ran) == sorted(TOOLS * 2) and llm.count == 3
    assert store.wait_for(lambda s: s.run(run_ids[0]) is not None, 10.0)
    rec = store.run(run_ids[0])
    names = collections.Counter(name for name, _ in seen)
    ids = [cid for _, cid in seen]
    assert (rec.tool_calls, dict(names)) == (6, dict.fromkeys(TOOLS, 2)), (
        f"record tool_calls {rec.tool_calls}; execute_tool spans (name, call id): {seen}"
    )
    assert None not in ids and len(set(ids)) == 6, f"call ids of the execute_tool spans: {seen}"
    # The ids are the model's: each span names the call it recorded.
    by_id = {cid: name for name, cid in _asked_ids(llm, api)}
    assert len(by_id) == 6 and all(by_id.get(cid) == name for name, cid in seen), (seen, by_id)


def _tool_spans(spans: Any) -> list[tuple[str, str | None]]:
    return [
        (a.get("gen_ai.tool.name"), a.get("gen_ai.tool.call.id"))
        for a in spans.attributes("execute_tool")
    ]


def _asked(llm: Any, api: str) -> list[dict[str, Any]]:
    """Every tool call the model asked for, as the agent sent them back."""
    out: list[dict[str, Any]] = []
    _, body = llm.requests[-1]
    if api == "chat":
        for m in body["messages"]:
            out.extend(m.get("tool_calls") or ())
    else:
        out.extend(it for it in body["input"] if it.get("type") == "function_call")
    return out


def _asked_ids(llm: Any, api: str) -> list[tuple[str, str]]:
    return [
        (c["function"]["name"], c["id"]) if api == "chat" else (c["name"], c["call_id"])
        for c in _asked(llm, api)
    ]


# -- a previous_response_id chain on the plain client --------------------------------------------
LOOKUP_SCHEMA = {
    "type": "function",
    "name": "lookup",
    "description": "Look a question up.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
}


def _lookup(q: str) -> str:
    return "nothing new about " + q  # the same result every time


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_previous_response_id_chain_repeating_one_call_is_stopped_as_a_loop(
    llm, server, mode
) -> None:
    _, store = server
    guard.instrument()
    llm.script = lambda body, api: tool("lookup", {"q": "x"}, input=40, output=8)
    ran: list[str] = []

    def outputs(resp: Any) -> list[dict[str, Any]]:
        items = []
        for it in resp.output:
            if it.type == "function_call":
                q = json.loads(it.arguments)["q"]
                ran.append(q)
                items.append(
                    {"type": "function_call_output", "call_id": it.call_id, "output": _lookup(q)}
                )
        return items

    if mode == "sync":
        client = openai.OpenAI(base_url=llm.base_url, api_key="test", max_retries=0)

        @guard.run(agent="chained", max_steps=20)
        def chained() -> None:
            resp = client.responses.create(
                model="gpt-4.1", input="what is x?", tools=[LOOKUP_SCHEMA]
            )
            while items := outputs(resp):
                resp = client.responses.create(
                    model="gpt-4.1",
                    input=items,
                    previous_response_id=resp.id,
                    tools=[LOOKUP_SCHEMA],
                )

        call = chained
    else:
        aclient = openai.AsyncOpenAI(base_url=llm.base_url, api_key="test", max_retries=0)

        @guard.run(agent="chained", max_steps=20)
        async def achained() -> None:
            resp = await aclient.responses.create(
                model="gpt-4.1", input="what is x?", tools=[LOOKUP_SCHEMA]
            )
            while items := outputs(resp):
                resp = await aclient.responses.create(
                    model="gpt-4.1",
                    input=items,
                    previous_response_id=resp.id,
                    tools=[LOOKUP_SCHEMA],
                )

        def call() -> None:
            asyncio.run(achained())

    with pytest.raises(guard.RunStopped) as stop:
        call()
    o = stop.value.outcome
    assert store.wait_for(lambda s: s.run(o.run_id) is not None, 10.0)
    rec = store.run(o.run_id)
    # The third identical call's result is read from the fourth request, which never leaves.
    got = (str(o.reason), rec.tool_calls, llm.count, len(ran))
    assert got == ("loop_detected", 3, 3, 3), (
        f"(reason, record tool_calls, requests sent, tools run): {got}; {o.message}"
    )
    assert rec.model_calls == 3 and str(rec.reason) == "loop_detected"
    # Each request after the first really carried only the new output, chained by id.
    for _, body in llm.requests[1:]:
        assert body["previous_response_id"].startswith("resp-")
        assert [it["type"] for it in body["input"]] == ["function_call_output"]
