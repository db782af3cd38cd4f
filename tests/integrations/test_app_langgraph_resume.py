"""LangGraph human in the loop: a graph interrupted for approval (``langgraph.types.interrupt``)
and resumed later (``graph.invoke(Command(resume=...), config)``), each invocation in a
``@guard.run`` of its own with a checkpointer keeping the conversation.

The contract: each invocation is a run of its own that counts only the calls made after it
started. The resumed invocation's first model request resends the whole conversation (the
first invocation's three tool calls and their results); those are not its calls. So with
``max_tool_calls=4`` on each run, the first makes 3 tool calls and is interrupted, and the
second makes 2 more and finishes: neither is stopped, and their records have 3 and 2.
"""

from __future__ import annotations

from typing import Any

import pytest
from _lg import chat
from _llm_server import Reply, text, tool
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool as lc_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command, interrupt

import guard

BEFORE_APPROVAL = 3  # tool calls of the first invocation
AFTER_APPROVAL = 2  # tool calls of the resumed one
CONFIG = {"configurable": {"thread_id": "refund-77"}, "recursion_limit": 50}


def _tool_results(body: dict[str, Any]) -> int:
    return sum(1 for m in body.get("messages") or () if m.get("role") == "tool")


def refund_model(body: dict[str, Any], api: str) -> Reply:
    """Looks up one order line per turn (new arguments each time), five in all, then answers."""
    n = _tool_results(body)
    if n < BEFORE_APPROVAL + AFTER_APPROVAL:
        return tool("lookup", {"line": f"A-{n + 1}"}, input=80, output=10)
    return text("Refund issued for all five lines.", input=80, output=10)


def _graph(llm: Any, ran: list[str], asked: list[Any]) -> Any:
    @lc_tool
    def lookup(line: str) -> str:
        """Look up one line of the order."""
        ran.append(line)
        return f"line {line}: refundable"  # a new fact each time: no loop

    tools = [lookup]
    model = chat(llm).bind_tools(tools)

    def agent(state: MessagesState) -> dict:
        return {"messages": [model.invoke(state["messages"])]}

    def approval(state: MessagesState) -> dict:
        """After the third lookup a human approves the refund before the agent goes on."""
        done = sum(1 for m in state["messages"] if m.type == "tool")
        if done != BEFORE_APPROVAL:
            return {}
        decision = interrupt({"question": "approve the refund?", "lines": done})
        asked.append(decision)
        return {"messages": [HumanMessage(f"approval: {decision}")]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode(tools))
    g.add_node("approval", approval)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    g.add_edge("tools", "approval")
    g.add_edge("approval", "agent")
    return g.compile(checkpointer=InMemorySaver(), name="refund-approval")


@pytest.mark.parametrize("entry", ["invoke", "ainvoke"])
async def test_a_resumed_graph_is_a_run_of_its_own_counting_only_its_own_calls(
    llm, server, entry
) -> None:
    _, sink = server
    guard.instrument()
    llm.script = refund_model
    ran: list[str] = []
    asked: list[Any] = []
    graph = _graph(llm, ran, asked)

    async def drive(inp: Any) -> dict:
        if entry == "invoke":
            return graph.invoke(inp, CONFIG)
        return await graph.ainvoke(inp, CONFIG)

    @guard.run(agent="refunds", max_tool_calls=4)
    async def start() -> tuple[str, dict]:
        return guard.current_run().run_id, await drive({"messages": [("user", "refund A")]})

    @guard.run(agent="refunds", max_tool_calls=4)
    async def resume() -> tuple[str, dict]:
        return guard.current_run().run_id, await drive(Command(resume="approved"))

    first_id, first = await start()
    assert "__interrupt__" in first, "the graph was not interrupted for approval"
    assert ran == ["A-1", "A-2", "A-3"] and llm.count == 3 and asked == []
    try:
        second_id, second = await resume()
    except guard.RunStopped as stop:
        o = stop.outcome
        pytest.fail(
            f"the resumed run was stopped: {o.reason} ({o.message}); its tool_calls "
            f"{o.tool_calls}, model_calls {o.model_calls}; model requests sent so far: "
            f"{llm.count} (3 before the resume)"
        )
    assert second["messages"][-1].content == "Refund issued for all five lines."
    assert asked == ["approved"] and ran == ["A-1", "A-2", "A-3", "A-4", "A-5"]
    assert llm.count == 6
    assert sink.wait_for(lambda s: s.run(first_id) and s.run(second_id), 10.0)
    got = [
        (str(r.status), r.tool_calls, r.model_calls)
        for r in (sink.run(first_id), sink.run(second_id))
    ]
    assert got == [("completed", 3, 3), ("completed", 2, 3)], (
        f"records (status, tool_calls, model_calls) of the two invocations: {got}"
    )
    # The interrupted invocation can be resumed from where it stopped, and says so; the
    # resumed one finished its work.
    flags = [(r.partial_result, r.recoverable) for r in (sink.run(first_id), sink.run(second_id))]
    assert flags == [(True, True), (False, False)], f"(partial_result, recoverable): {flags}"
