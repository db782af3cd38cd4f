"""The ``anthropic`` integration with the real ``anthropic`` client against the scripted
server's Messages endpoint: the hand-written loops (sync and async; ``create``,
``create(stream=True)`` and the ``messages.stream(...)`` helper) that the contract suite
``test_providers.py`` runs, and what only this client has here (a guard-side failure while
reading its usage, its example)."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
from _llm_server import LLMServer, text, tool

import guard

HOWS = ("create", "stream", "helper")
VARIANTS = [(mode, how) for mode in ("sync", "async") for how in HOWS]
IDS = [f"{m}-{h}" for m, h in VARIANTS]
MODEL = "claude-sonnet-4-5"
ASK = {"role": "user", "content": "find the refund policy"}


def _client(llm: LLMServer, mode: str, **kw: Any) -> Any:
    cls = anthropic.Anthropic if mode == "sync" else anthropic.AsyncAnthropic
    return cls(base_url=llm.anthropic_base_url, api_key="test", max_retries=0, **kw)


class _Blocks:
    """The content blocks of a streamed reply, put together from its raw events."""

    def __init__(self) -> None:
        self.blocks: list[dict[str, Any]] = []
        self._json: dict[int, str] = {}

    def see(self, event: Any) -> None:
        if event.type == "content_block_start":
            self.blocks.append(event.content_block.model_dump(exclude_none=True))
        elif event.type == "content_block_delta" and event.delta.type == "input_json_delta":
            self._json[event.index] = self._json.get(event.index, "") + event.delta.partial_json
        elif event.type == "content_block_stop" and event.index in self._json:
            import json

            self.blocks[event.index]["input"] = json.loads(self._json.pop(event.index))


def _dump(content: Any) -> list[dict[str, Any]]:
    return [b.model_dump(exclude_none=True) for b in content]


def _ask_sync(client: Any, how: str, messages: list[Any], **kw: Any) -> list[dict[str, Any]]:
    """One model call; returns the reply's content blocks (as the loop sends them back)."""
    kw.setdefault("max_tokens", 1024)
    if how == "create":
        return _dump(client.messages.create(model=MODEL, messages=messages, **kw).content)
    if how == "stream":
        acc = _Blocks()
        for event in client.messages.create(model=MODEL, messages=messages, stream=True, **kw):
            acc.see(event)
        return acc.blocks
    with client.messages.stream(model=MODEL, messages=messages, **kw) as s:
        return _dump(s.get_final_message().content)


async def _ask_async(client: Any, how: str, messages: list[Any], **kw: Any) -> list[dict[str, Any]]:
    kw.setdefault("max_tokens", 1024)
    if how == "create":
        return _dump((await client.messages.create(model=MODEL, messages=messages, **kw)).content)
    if how == "stream":
        acc = _Blocks()
        s = await client.messages.create(model=MODEL, messages=messages, stream=True, **kw)
        async for event in s:
            acc.see(event)
        return acc.blocks
    async with client.messages.stream(model=MODEL, messages=messages, **kw) as s:
        return _dump((await s.get_final_message()).content)


def _turn(messages: list[Any], blocks: list[dict[str, Any]], tools: dict[str, Any]) -> bool:
    """Run the tools the reply asks for and append both turns; ``False`` once it answers."""
    uses = [b for b in blocks if b["type"] == "tool_use"]
    if not uses:
        return False
    messages.append({"role": "assistant", "content": blocks})
    results = [
        {"type": "tool_result", "tool_use_id": b["id"], "content": tools[b["name"]](**b["input"])}
        for b in uses
    ]
    messages.append({"role": "user", "content": results})
    return True


def _agent(llm: LLMServer, mode: str, how: str, tools: dict[str, Any], converse: bool, **limits):
    """A hand-written tool loop with no ``guard.step`` and no ``@guard.tool``: only
    ``guard.instrument()`` + ``@guard.run``. ``converse``: the loop sends the conversation
    back (the tool results read from it feed loop detection); else the same first turn."""
    client = _client(llm, mode)

    def fresh(messages: list[Any]) -> list[Any]:
        return messages if converse else [ASK]

    if mode == "sync":

        @guard.run(agent="anthropic-loop", **limits)
        def run_sync(**kw: Any) -> str:
            messages: list[Any] = [ASK]
            while _turn(messages, _ask_sync(client, how, fresh(messages), **kw), tools):
                pass
            return "answered"

        return run_sync

    @guard.run(agent="anthropic-loop", **limits)
    async def run_async(**kw: Any) -> str:
        messages: list[Any] = [ASK]
        while _turn(messages, await _ask_async(client, how, fresh(messages), **kw), tools):
            pass
        return "answered"

    return lambda **kw: asyncio.run(run_async(**kw))


def _varying(body: dict[str, Any], api: str) -> Any:
    assert api == "anthropic"
    return tool("lookup", {"q": f"refund policy variant {len(str(body))}"})


def test_a_guard_side_failure_never_breaks_the_call(sink, llm, monkeypatch) -> None:
    from guard.integrations import anthropic as integration
    from guard.integrations._base import errors

    guard.instrument("anthropic")

    def broken(u: Any) -> Any:
        raise RuntimeError("guard bug")

    monkeypatch.setattr(integration, "usage", broken)
    llm.script = [text("hi", input=5, output=1)]
    before = errors().get("recording a model call", 0)

    @guard.run(agent="robust")
    def agent() -> str:
        return _client(llm, "sync").messages.create(model=MODEL, messages=[ASK], max_tokens=16)

    assert agent().content[0].text == "hi" and llm.count == 1  # the client's own reply
    assert errors().get("recording a model call", 0) == before + 1  # logged and counted


def test_the_example_runs_with_one_line_of_guard_code(llm) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    from _llm_server import _demo

    llm.script = _demo  # a model that keeps rephrasing a search that finds nothing
    example = Path(__file__).resolve().parents[2] / "examples" / "anthropic_client.py"
    env = {**os.environ, "ANTHROPIC_BASE_URL": llm.anthropic_base_url, "ANTHROPIC_API_KEY": "t"}
    env.pop("OTEL_GUARD_ENDPOINT", None)
    out = subprocess.run(
        [sys.executable, str(example)], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("terminated loop_detected after 5 model calls"), out.stdout
    assert llm.count == 5
