"""Multi-turn chats that remember their history, one ``@guard.run`` per user turn, written the
way each framework's docs write them: an Agents SDK ``Session``, Pydantic AI's
``message_history``, a LangGraph agent with a checkpointer, and a hand-written chat completions
loop over a ``messages`` list kept across turns.

The contract: a run counts only the calls made during it. The history a chat resends each turn
(the earlier turns' tool calls and their results) is not charged to the new run, nor fed to
its loop detection again. The scenario is a support chat that checks the same order once per
turn (``check_order(order_id="A1")``, the same status every time): turns 1-3 call the tool once
and then answer, turn 4 answers without a tool. Every turn completes, and each turn's
termination record has exactly that turn's calls: tool calls 1, 1, 1, 0 and model calls
2, 2, 2, 1.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import Any

import openai
import pytest
from _lg import chat
from _llm_server import LLMServer, Reply, text, tool
from langchain_core.tools import tool as lc_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, create_react_agent, tools_condition
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import guard
from guard.server import MemorySink

agents = pytest.importorskip("agents")  # imported here: its import alone takes seconds
from agents import (  # noqa: E402
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    SQLiteSession,
    function_tool,
    set_tracing_disabled,
)

pytestmark = pytest.mark.filterwarnings("ignore:create_react_agent has been moved")

TURNS = [
    "Where is my order A1?",
    "Has order A1 shipped yet?",
    "Any news on order A1?",
    "Thanks, that is all.",
]
STATUS = "order A1: shipped, arriving Friday"
WANT_TOOLS = [1, 1, 1, 0]
WANT_MODEL = [2, 2, 2, 1]


# -- the scripted support model: it answers by what the conversation's last message is --------
def _last_and_users(body: dict[str, Any], api: str) -> tuple[str, int]:
    """("tool" when the last message is a tool result, else "user"; how many user turns)."""
    if api == "chat":
        msgs = body.get("messages") or []
        users = sum(1 for m in msgs if m.get("role") == "user")
        return ("tool" if msgs and msgs[-1].get("role") == "tool" else "user"), users
    items = body.get("input")
    if isinstance(items, str):
        return "user", 1
    items = list(items or [])
    users = sum(1 for it in items if isinstance(it, dict) and it.get("role") == "user")
    last = items[-1] if items else {}
    return ("tool" if last.get("type") == "function_call_output" else "user"), users


def support_model(body: dict[str, Any], api: str) -> Reply:
    """Turns 1-3: ``check_order(A1)`` then an answer; turn 4: an answer without a tool."""
    last, users = _last_and_users(body, api)
    if last == "tool":
        return text("Your order A1 has shipped and arrives Friday.", input=60, output=12)
    if users >= len(TURNS):
        return text("You are welcome!", input=60, output=5)
    return tool("check_order", {"order_id": "A1"}, input=50, output=10)


def check_order_status(order_id: str) -> str:
    return STATUS if order_id == "A1" else f"order {order_id}: unknown"


# -- reading the records --------------------------------------------------------------------------
def _records(sink: MemorySink, run_ids: list[str]) -> list[Any]:
    assert len(run_ids) == len(TURNS), run_ids
    assert sink.wait_for(lambda s: all(s.run(r) is not None for r in run_ids), 10.0), (
        f"records of {run_ids}: got {[o.run_id for o in sink.runs]}"
    )
    return [sink.run(r) for r in run_ids]


def _assert_each_turn_has_its_own_calls(
    sink: MemorySink, run_ids: list[str], stops: list[Any], llm: LLMServer, ran: list[str]
) -> None:
    recs = _records(sink, run_ids)
    got = [(str(r.status), r.tool_calls, r.model_calls) for r in recs]
    want = [("completed", t, m) for t, m in zip(WANT_TOOLS, WANT_MODEL, strict=True)]
    assert not stops and got == want, (
        f"records (status, tool_calls, model_calls) per turn: {got}; "
        f"stopped turns (turn, reason, tool_calls, model_calls): {stops}"
    )
    assert llm.count == sum(WANT_MODEL) and len(ran) == sum(WANT_TOOLS)


def _turns(handle: Any) -> tuple[list[str], list[Any]]:
    """Drive the four turns through ``handle(message) -> run_id`` (a coroutine function: all
    turns on one event loop, as a chat server runs them); a stopped turn is noted (with its
    outcome) and the conversation goes on."""
    run_ids: list[str] = []
    stops: list[Any] = []

    def stopped(i: int, stop: guard.RunStopped) -> None:
        o = stop.outcome
        stops.append((i, o.reason, o.tool_calls, o.model_calls))
        run_ids.append(o.run_id)

    if not inspect.iscoroutinefunction(handle):
        for i, msg in enumerate(TURNS, 1):
            try:
                run_ids.append(handle(msg))
            except guard.RunStopped as stop:
                stopped(i, stop)
        return run_ids, stops

    async def drive() -> None:
        for i, msg in enumerate(TURNS, 1):
            try:
                run_ids.append(await handle(msg))
            except guard.RunStopped as stop:
                stopped(i, stop)

    asyncio.run(drive())
    return run_ids, stops


# -- the OpenAI Agents SDK: a Session ------------------------------------------------------------
@pytest.mark.parametrize("api", ["chat", "responses"])
def test_agents_sdk_session_chat_charges_each_turn_only_its_own_calls(llm, server, api) -> None:
    _, sink = server
    guard.instrument()
    llm.script = support_model
    ran: list[str] = []

    @function_tool
    def check_order(order_id: str) -> str:
        """Look up the status of an order."""
        ran.append(order_id)
        return check_order_status(order_id)

    client = openai.AsyncOpenAI(base_url=llm.base_url, api_key="test", max_retries=0)
    cls = OpenAIChatCompletionsModel if api == "chat" else OpenAIResponsesModel
    agent = Agent(
        name="support",
        instructions="Help the customer with their order.",
        tools=[check_order],
        model=cls(model="gpt-4.1", openai_client=client),
    )
    session = SQLiteSession("customer-42")  # in memory

    @guard.run(agent="support-chat")
    async def turn(message: str) -> str:
        run_id = guard.current_run().run_id
        await Runner.run(agent, message, session=session)
        return run_id

    set_tracing_disabled(True)
    try:
        run_ids, stops = _turns(turn)
    finally:
        set_tracing_disabled(False)
    _assert_each_turn_has_its_own_calls(sink, run_ids, stops, llm, ran)
    # The session really resent the history: the last request carries all three tool results.
    assert '"call_' in json.dumps(llm.requests[-1][1])


# -- Pydantic AI: message_history ----------------------------------------------------------------
@pytest.mark.parametrize("history", ["all_messages", "new_messages"])
def test_pydantic_ai_message_history_chat_charges_each_turn_only_its_own_calls(
    llm, server, history
) -> None:
    _, sink = server
    guard.instrument()
    llm.script = support_model
    ran: list[str] = []
    client = openai.AsyncOpenAI(base_url=llm.base_url, api_key="test", max_retries=0)
    agent = PydanticAgent(
        OpenAIChatModel("gpt-4.1", provider=OpenAIProvider(openai_client=client)),
        name="support",
        instructions="Help the customer with their order.",
    )

    @agent.tool_plain
    def check_order(order_id: str) -> str:
        """Look up the status of an order."""
        ran.append(order_id)
        return check_order_status(order_id)

    messages: list[Any] = []

    @guard.run(agent="support-chat")
    def turn(message: str) -> str:
        run_id = guard.current_run().run_id
        result = agent.run_sync(message, message_history=list(messages))
        if history == "all_messages":
            messages[:] = result.all_messages()
        else:
            messages.extend(result.new_messages())
        return run_id

    run_ids, stops = _turns(turn)
    _assert_each_turn_has_its_own_calls(sink, run_ids, stops, llm, ran)


# -- LangGraph: a checkpointer and a thread id ---------------------------------------------------
def _lg_check_order(ran: list[str]) -> Any:
    @lc_tool
    def check_order(order_id: str) -> str:
        """Look up the status of an order."""
        ran.append(order_id)
        return check_order_status(order_id)

    return check_order


def _state_graph(model: Any, tools: list[Any], checkpointer: Any) -> Any:
    bound = model.bind_tools(tools)

    def call_model(state: MessagesState) -> dict:
        return {"messages": [bound.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", call_model)
    g.add_node("tools", ToolNode(tools))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=checkpointer, name="support-graph")


@pytest.mark.parametrize("build", ["create_react_agent", "StateGraph"])
def test_langgraph_checkpointer_chat_charges_each_turn_only_its_own_calls(
    llm, server, build
) -> None:
    _, sink = server
    guard.instrument()
    llm.script = support_model
    ran: list[str] = []
    tools = [_lg_check_order(ran)]
    if build == "create_react_agent":
        graph = create_react_agent(chat(llm), tools, checkpointer=InMemorySaver())
    else:
        graph = _state_graph(chat(llm), tools, InMemorySaver())
    config = {"configurable": {"thread_id": "customer-42"}}

    @guard.run(agent="support-chat")
    def turn(message: str) -> str:
        run_id = guard.current_run().run_id
        out = graph.invoke({"messages": [("user", message)]}, config)
        assert out["messages"][-1].type == "ai"
        return run_id

    run_ids, stops = _turns(turn)
    _assert_each_turn_has_its_own_calls(sink, run_ids, stops, llm, ran)
    # The checkpointer really resent the history: 4 user turns and 3 tool results at the end.
    last = llm.requests[-1][1]["messages"]
    assert [m["role"] for m in last].count("tool") == 3


# -- the plain openai client: a hand-written chat completions loop -------------------------------
CHECK_ORDER_SCHEMA = {
    "type": "function",
    "function": {
        "name": "check_order",
        "description": "Look up the status of an order.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    },
}


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_hand_written_chat_completions_loop_charges_each_turn_only_its_own_calls(
    llm, server, mode
) -> None:
    _, sink = server
    guard.instrument()
    llm.script = support_model
    ran: list[str] = []
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Help the customer with their order."}
    ]

    def handle_reply(msg: Any) -> bool:
        """Append the assistant's reply (and run its tools); True when it was an answer."""
        calls = msg.tool_calls or []
        entry: dict[str, Any] = {"role": "assistant", "content": msg.content}
        if calls:
            entry["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in calls
            ]
        messages.append(entry)
        for c in calls:
            args = json.loads(c.function.arguments)
            ran.append(args["order_id"])
            out = check_order_status(**args)
            messages.append({"role": "tool", "tool_call_id": c.id, "content": out})
        return not calls

    if mode == "sync":
        client = openai.OpenAI(base_url=llm.base_url, api_key="test", max_retries=0)

        @guard.run(agent="support-chat")
        def turn(message: str) -> str:
            run_id = guard.current_run().run_id
            messages.append({"role": "user", "content": message})
            for _ in range(10):
                r = client.chat.completions.create(
                    model="gpt-4.1", messages=messages, tools=[CHECK_ORDER_SCHEMA]
                )
                if handle_reply(r.choices[0].message):
                    break
            return run_id

        handle = turn
    else:
        aclient = openai.AsyncOpenAI(base_url=llm.base_url, api_key="test", max_retries=0)

        @guard.run(agent="support-chat")
        async def aturn(message: str) -> str:
            run_id = guard.current_run().run_id
            messages.append({"role": "user", "content": message})
            for _ in range(10):
                r = await aclient.chat.completions.create(
                    model="gpt-4.1", messages=messages, tools=[CHECK_ORDER_SCHEMA]
                )
                if handle_reply(r.choices[0].message):
                    break
            return run_id

        handle = aturn

    run_ids, stops = _turns(handle)
    _assert_each_turn_has_its_own_calls(sink, run_ids, stops, llm, ran)
    assert [m["role"] for m in messages].count("tool") == 3
