"""A LangGraph ReAct agent guarded with one line: ``guard.instrument()`` plus ``@guard.run``.

    pip install 'otel-guard[langgraph]'
    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=... python examples/langgraph_agent.py

Any OpenAI-compatible server works (the tests' scripted one:
``tests/integrations/_llm_server.py``). Set ``OTEL_GUARD_ENDPOINT`` to report to a guard;
without it the SDK enforces the limits itself (local-only mode). The model calls are counted
(usage and response id, once), reserved and cancel-checked; every tool call feeds loop
detection; each model turn with its tools is a step; a stop comes out of ``agent.invoke`` as
``guard.RunStopped``, and a refused tool call never reaches the model.
"""

from __future__ import annotations

import os

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent

import guard

guard.instrument()  # the one line: openai + langgraph (every importable integration)


@tool
def lookup_order(order: str) -> str:
    """Look up a refund order by its number."""
    return "refund issued on 2026-11-02" if order == "1234" else "no such order"


agent = create_react_agent(
    ChatOpenAI(model=os.environ.get("OPENAI_MODEL", "gpt-4.1-mini")), [lookup_order]
)


@guard.run(agent="refund-bot", max_steps=12, max_tokens=60_000)
def handle(question: str) -> str:
    result = agent.invoke({"messages": [("user", question)]})
    return result["messages"][-1].content


if __name__ == "__main__":
    for question in ("Where is my refund for order 1234?", "Where is order 9?"):
        try:
            print(f"{question!r}: {handle(question)}")
        except guard.RunStopped as stop:
            o = stop.outcome
            print(
                f"{question!r}: {o.status} {o.reason} after {o.steps} steps, "
                f"{o.model_calls} model calls, {o.input_tokens + o.output_tokens} tokens"
            )
    guard.shutdown()
