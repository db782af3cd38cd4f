"""Shared pieces of the LangChain/LangGraph tests: a ChatOpenAI on the scripted server, a
runaway script (tool calls with new arguments, the same result), and a lookup tool."""

from __future__ import annotations

import itertools
import json
from typing import Any

from _llm_server import LLMServer, Reply, Usage, text, tool
from langchain_core.tools import tool as lc_tool
from langchain_openai import ChatOpenAI

import guard

# Both ways to count: the openai client layer (ChatOpenAI calls it), or this integration alone
# (LangChain's usage_metadata). Either way each model call is counted once.
MODES = {"all": (), "langgraph-only": ("langchain",)}


def instrument(mode: str) -> str:
    """``guard.instrument()`` (openai + langchain), or ``guard.instrument("langchain")``."""
    names = guard.instrument(*MODES[mode])
    assert "langchain" in names and ("openai" in names) == (mode == "all")
    return mode


def chat(llm: LLMServer, **kw: Any) -> ChatOpenAI:
    return ChatOpenAI(model="gpt-4.1", base_url=llm.base_url, api_key="test", max_retries=0, **kw)


def runaway(**usage: int) -> Any:
    """A model that asks for ``lookup`` with a new order number every time, forever."""
    n = itertools.count(1)

    def script(body: dict[str, Any], api: str) -> Reply:
        return tool("lookup", {"order": f"A-{next(n)}"}, **usage)

    return script


def then_answer(calls: int, **usage: int) -> list[Reply]:
    """``calls`` tool calls (new arguments each), then a final answer."""
    replies = [tool("lookup", {"order": f"A-{i}"}, **usage) for i in range(calls)]
    return [*replies, text("done", **usage)]


def two_lookups(**usage: int) -> Reply:
    """An answer asking for two ``lookup`` calls at once (ToolNode runs them in parallel)."""
    a, b = tool("lookup", {"order": "A-1"}), tool("lookup", {"order": "B-2"})
    return Reply(tool_calls=a.tool_calls + b.tool_calls, usage=Usage(**usage))


class Lookup:
    """A ``@tool`` that counts its real executions."""

    def __init__(self) -> None:
        self.ran = 0

        @lc_tool
        def lookup(order: str) -> str:
            """Look up an order by its number."""
            self.ran += 1
            return "no such order"

        self.tool = lookup


def tool_messages(llm: LLMServer) -> list[str]:
    """The text of every tool result the model was sent."""
    out = []
    for _, body in llm.requests:
        for m in body.get("messages", []):
            if m.get("role") == "tool":
                out.append(m["content"] if isinstance(m["content"], str) else json.dumps(m))
    return out
