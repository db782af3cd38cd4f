"""Pydantic AI's Anthropic model (it calls ``client.beta.messages``) against the scripted
server's ``/v1/messages``: each call counted once with exact tokens, by its model layer
(``pydantic_ai`` alone) or by the anthropic client layer under it (both on)."""

from __future__ import annotations

import asyncio
import itertools

import anthropic
import pytest
from _llm_server import LLMServer, tool
from pydantic_ai import Agent
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.providers.anthropic import AnthropicProvider

import guard

# input 1200 = 900 fresh + 200 cache reads + 100 cache writes; output 90 with 30 of thinking
U = {"input": 1200, "output": 90, "cached": 200, "cache_write": 100, "reasoning": 30}


@pytest.mark.parametrize("on", [("pydantic_ai",), ("anthropic", "pydantic_ai")], ids="+".join)
@pytest.mark.parametrize("stream", [False, True], ids=["run", "stream"])
def test_each_call_counted_once_with_exact_tokens(sink, llm: LLMServer, on, stream) -> None:
    assert guard.instrument(*on) == list(on)
    n = itertools.count(1)
    llm.script = lambda body, api: tool("lookup", {"q": f"order {next(n)}"}, **U)
    client = anthropic.AsyncAnthropic(base_url=llm.anthropic_base_url, api_key="t", max_retries=0)
    model = AnthropicModel("claude-sonnet-4-5", provider=AnthropicProvider(anthropic_client=client))
    agent = Agent(model, name="claude-bot", model_settings={"max_tokens": 100})

    @agent.tool_plain
    def lookup(q: str) -> str:
        return f"nothing for {q}"

    # Each call spends 1,290. Before the third leaves, its prompt (with Claude's tool-use
    # preamble) and its 100 max tokens are held: more than the 420 left, so it never leaves
    # (counted twice, the first call alone would use 2,580 and refuse the second).
    @guard.run(agent="pai-claude", max_tokens=3000, loop={"repeat_threshold": 20})
    async def handle() -> None:
        if not stream:
            await agent.run("refund?")
            return
        async with agent.run_stream("refund?") as s:
            await s.get_output()

    with pytest.raises(guard.RunStopped) as stop:
        asyncio.run(handle())
    o = stop.value.outcome
    assert o.reason == "token_budget" and "reservation refused" in o.message, o.message
    assert "used+reserved 2580" in o.message, o.message
    assert llm.count == 2
    assert (o.model_calls, o.input_tokens, o.output_tokens) == (2, 2400, 180)
    assert (o.cached_tokens, o.reasoning_tokens) == (400, 60)
