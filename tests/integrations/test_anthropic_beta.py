"""``client.beta.messages`` (create, ``stream=True``, the ``.stream()`` helper; sync and async)
is guarded like ``client.messages``: counted once with exact tokens, stopped by a budget
before the next request leaves, and a loop's tool calls read back from the conversation."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from _llm_server import LLMServer, text, tool
from test_anthropic import ASK, IDS, VARIANTS, _ask_async, _ask_sync, _client, _turn

import guard

U = {"input": 300, "output": 100, "cached": 40, "cache_write": 20, "reasoning": 25}


def _loop(llm: LLMServer, mode: str, how: str, **limits: Any) -> Any:
    """A hand-written tool loop on ``client.beta.messages`` (a beta header set)."""
    client = _client(llm, mode)
    kw = {"max_tokens": 100, "betas": ["token-efficient-tools-2025-02-19"]}
    tools = {"lookup": lambda q: "no results"}
    if mode == "sync":

        @guard.run(agent="beta-loop", **limits)
        def run_sync() -> None:
            messages: list[Any] = [ASK]
            while _turn(messages, _ask_sync(client.beta, how, messages, **kw), tools):
                pass

        return run_sync

    @guard.run(agent="beta-loop", **limits)
    async def run_async() -> None:
        messages: list[Any] = [ASK]
        while _turn(messages, await _ask_async(client.beta, how, messages, **kw), tools):
            pass

    return lambda: asyncio.run(run_async())


@pytest.mark.parametrize(("mode", "how"), VARIANTS, ids=IDS)
def test_beta_messages_are_counted_once_with_exact_tokens(sink, llm, mode, how) -> None:
    guard.instrument("anthropic")
    # new arguments each turn; an answer after 8 calls bounds a loop the guard does not see
    llm.script = lambda body, api: (
        text("done") if llm.count > 8 else tool("lookup", {"q": f"p{llm.count}"}, **U)
    )
    with pytest.raises(guard.RunStopped) as stop:
        _loop(llm, mode, how, max_tokens=1_500, max_steps=50, loop={"repeat_threshold": 20})()
    o = stop.value.outcome
    assert o.reason == "token_budget", o.message
    assert llm.count == 4  # 4 calls reach 1,600 >= 1,500: the 5th never leaves
    assert (o.model_calls, o.input_tokens, o.output_tokens) == (4, 1200, 400)
    assert (o.cached_tokens, o.reasoning_tokens) == (160, 100)
    assert o.tool_calls == 3  # read back from the tool_result blocks the loop sent
    ids = [a.get("gen_ai.response.id") for a in sink.attributes("chat")]
    assert len(set(ids)) == 4 and all(i.startswith("msg_") for i in ids)
