"""Shared pieces of the Pydantic AI integration tests: an agent on the scripted server, scripts."""

from __future__ import annotations

import itertools
from typing import Any

import openai
from _llm_server import LLMServer, Reply, text, tool
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider

__all__ = ["MODES", "agent_on", "finishing", "runaway"]

# Which integrations count the model calls: Pydantic AI's model layer alone, or the openai
# client layer under it (the Pydantic AI layer then leaves those calls alone).
MODES = [("pydantic_ai",), ("openai", "pydantic_ai")]


def agent_on(llm: LLMServer, api: str = "chat", name: str | None = "bot", **kw: Any) -> Agent:
    """A real Agent on a real AsyncOpenAI client against the local server, with one tool
    ``lookup(q)`` that returns the same text whatever it is asked (the runaway's tool)."""
    client = openai.AsyncOpenAI(base_url=llm.base_url, api_key="test", max_retries=0)
    provider = OpenAIProvider(openai_client=client)
    cls = OpenAIChatModel if api == "chat" else OpenAIResponsesModel
    agent = Agent(cls("gpt-4.1", provider=provider), name=name, **kw)

    @agent.tool_plain
    def lookup(q: str) -> str:
        return "no such order"

    return agent


def runaway(**usage: int) -> Any:
    """A model that asks for ``lookup`` forever, with new arguments every time."""
    n = itertools.count(1)
    return lambda body, api: tool("lookup", {"q": f"order {next(n)}"}, **usage)


def finishing(turns: int, **usage: int) -> list[Reply]:
    """``turns`` tool calls with new arguments, then a final answer (same usage each)."""
    return [tool("lookup", {"q": f"order {i}"}, **usage) for i in range(turns)] + [
        text("done", **usage)
    ]
