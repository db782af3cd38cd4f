"""The ``anthropic`` integration with the real ``anthropic`` client against the scripted
server's Messages endpoint: sync and async; ``create``, ``create(stream=True)`` and the
``messages.stream(...)`` helper; raw responses."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import pytest
from _llm_server import LLMServer, error, text, tool
from test_openai import _cancel_when_held  # the same cancel choreography as there

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


@pytest.mark.parametrize(("mode", "how"), VARIANTS, ids=IDS)
def test_a_runaway_loop_is_stopped_as_loop_detected(sink, llm, mode, how) -> None:
    """Varying arguments, the same result: the tool calls are read back from the
    ``tool_use`` / ``tool_result`` blocks the loop sends, fingerprinted in-process."""
    guard.instrument("anthropic")
    llm.script = _varying
    agent = _agent(llm, mode, how, {"lookup": lambda q: "no results"}, True, max_steps=60)
    with pytest.raises(guard.RunStopped) as stop:
        agent()
    o = stop.value.outcome
    assert o.reason == "loop_detected", o.message
    assert o.model_calls == llm.count < 60  # stopped before the next request left
    assert o.tool_calls == o.model_calls and o.steps == o.model_calls
    assert len(sink.named("guard.step")) == o.steps  # every inferred step ended
    assert "refund policy variant" not in sink.dump()  # only fingerprints leave
    tools = sink.attributes("execute_tool")
    assert tools and all(a["guard.action.fingerprint"] and a["guard.result.hash"] for a in tools)


@pytest.mark.parametrize(("mode", "how"), VARIANTS, ids=IDS)
def test_token_budget_with_exact_tokens_in_the_record(sink, llm, mode, how) -> None:
    """Anthropic's ``input_tokens`` leave out cache reads and writes: the record's input
    tokens are the whole prompt (300 = 240 + 40 read + 20 written), cached the reads."""
    guard.instrument("anthropic")
    u = {"input": 300, "output": 100, "cached": 40, "cache_write": 20, "reasoning": 25}
    llm.script = [tool("lookup", {"q": "a"}, **u)]
    agent = _agent(llm, mode, how, {"lookup": lambda q: q}, False, max_tokens=1_500, max_steps=50)
    with pytest.raises(guard.RunStopped) as stop:
        agent(max_tokens=100)  # the request's max_tokens: reserved, and covered each time
    o = stop.value.outcome
    n = llm.count
    assert o.reason == "token_budget", o.message
    assert n == 4  # 4 calls reach 1,600 >= 1,500: the 5th never leaves
    assert (o.input_tokens, o.output_tokens, o.cached_tokens, o.reasoning_tokens) == (
        300 * n,
        100 * n,
        40 * n,
        25 * n,
    )
    assert o.model_calls == n
    ids = [a.get("gen_ai.response.id") for a in sink.attributes("chat")]
    assert len(ids) == n and len(set(ids)) == n and all(i.startswith("msg_") for i in ids)


def test_the_request_max_tokens_is_reserved_before_the_call_leaves(sink, llm) -> None:
    guard.instrument("anthropic")
    llm.script = [text("done", input=10, output=10)]
    client = _client(llm, "sync")

    @guard.run(agent="reserving", max_tokens=1_000)
    def agent() -> None:
        client.messages.create(model=MODEL, messages=[ASK], max_tokens=200)
        with client.messages.stream(model=MODEL, messages=[ASK], max_tokens=5_000) as s:
            s.until_done()

    with pytest.raises(guard.RunStopped) as stop:
        agent()
    assert stop.value.outcome.reason == "token_budget"
    assert "reservation refused" in stop.value.outcome.message
    assert llm.count == 1 and stop.value.outcome.input_tokens == 10


@pytest.mark.parametrize(("mode", "how"), VARIANTS, ids=IDS)
def test_at_most_the_call_in_flight_completes_after_a_cancel(sink, llm, mode, how) -> None:
    guard.instrument("anthropic")
    llm.script = lambda body, api: tool("lookup", {"q": str(len(llm.requests))})
    gate = llm.hold()  # the first request is held: the cancel lands while it is in flight
    runs: list[Any] = []
    client = _client(llm, mode)

    if mode == "sync":

        @guard.run(agent="cancelled", max_steps=100)
        def agent() -> None:
            runs.append(guard.current_run())
            while True:
                _ask_sync(client, how, [ASK])

        t = _cancel_when_held(gate, runs, lambda r: r.cancel("user_cancel"))
        with pytest.raises(guard.RunStopped) as stop:
            agent()
    else:

        @guard.run(agent="cancelled", max_steps=100)
        async def aagent() -> None:
            runs.append(guard.current_run())
            while True:
                await _ask_async(client, how, [ASK])

        t = _cancel_when_held(gate, runs, lambda r: r.cancel("user_cancel"))
        with pytest.raises(guard.RunStopped) as stop:
            asyncio.run(aagent())
    t.join(10)
    assert stop.value.outcome.reason == "user_cancel"
    assert llm.count == 1  # the held call was the one in flight; none left after the cancel


@pytest.mark.parametrize("how", ["stream", "helper"])
def test_a_stream_raises_at_the_next_event_after_a_cancel_and_closes_the_response(
    sink, llm, how
) -> None:
    guard.instrument("anthropic")
    llm.script = [text("a long answer that keeps streaming " * 4, input=50, output=40)]
    gate = llm.hold(after_events=3)
    client = _client(llm, "sync")
    seen: list[Any] = []

    def read(events: Any) -> None:
        for event in events:
            seen.append(event)
            if len(seen) == 1:
                guard.current_run().cancel("user_cancel")  # the gate still holds the rest

    @guard.run(agent="streamer")
    def agent() -> None:
        if how == "stream":
            read(client.messages.create(model=MODEL, messages=[ASK], max_tokens=64, stream=True))
        else:
            with client.messages.stream(model=MODEL, messages=[ASK], max_tokens=64) as s:
                read(s)  # the helper's events come off the guarded raw stream

    with gate.held(), pytest.raises(guard.RunStopped) as stop:
        agent()
    _cut(stop.value.outcome, seen, gate, llm)


def _cut(o: Any, seen: list[Any], gate: Any, llm: LLMServer) -> None:
    assert o.reason == "user_cancel" and len(seen) == 1
    assert gate.disconnected.wait(10)  # the HTTP response was closed, not read to its end
    assert o.model_calls == 1 and llm.count == 1
    assert o.input_tokens == 50  # message_start's usage, seen before the cut


@pytest.mark.parametrize("how", ["stream", "helper"])
def test_an_async_stream_is_cut_by_a_cancel_too(sink, llm, how) -> None:
    guard.instrument("anthropic")
    llm.script = [text("a long answer that keeps streaming " * 4, input=50, output=40)]
    gate = llm.hold(after_events=3)
    client = _client(llm, "async")
    seen: list[Any] = []

    async def read(events: Any) -> None:
        async for event in events:
            seen.append(event)
            if len(seen) == 1:
                guard.current_run().cancel("user_cancel")  # the gate still holds the rest

    @guard.run(agent="streamer")
    async def agent() -> None:
        kw = {"model": MODEL, "messages": [ASK], "max_tokens": 64}
        if how == "stream":
            await read(await client.messages.create(**kw, stream=True))
        else:
            async with client.messages.stream(**kw) as s:
                await read(s)

    with gate.held(), pytest.raises(guard.RunStopped) as stop:
        asyncio.run(agent())
    _cut(stop.value.outcome, seen, gate, llm)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_raw_responses_are_recorded_when_parsed(sink, llm, mode) -> None:
    guard.instrument("anthropic")
    llm.script = [text("ok", input=50, output=5)]
    client = _client(llm, mode)
    kw = {"model": MODEL, "messages": [ASK], "max_tokens": 64}

    @guard.run(agent="raw")
    async def agent_async() -> Any:
        raw = await client.messages.with_raw_response.create(**kw)
        assert raw.headers is not None  # the client's own response, passed through
        await raw.parse()  # the async client's parse() is a coroutine (no legacy type here)
        await raw.parse()  # cached: still one call
        async with client.messages.with_streaming_response.create(**kw, stream=True) as resp:
            async for _ in await resp.parse():
                pass
        return guard.current_run().usage()

    @guard.run(agent="raw")
    def agent_sync() -> Any:
        raw = client.messages.with_raw_response.create(**kw)
        raw.parse()
        raw.parse()
        with client.messages.with_streaming_response.create(**kw, stream=True) as resp:
            for _ in resp.parse():
                pass
        return guard.current_run().usage()

    o = asyncio.run(agent_async()) if mode == "async" else agent_sync()
    assert llm.count == 2
    assert (o.model_calls, o.input_tokens, o.output_tokens) == (2, 100, 10)


def test_a_model_error_that_ends_the_run_is_recorded_as_model_error(sink, llm) -> None:
    guard.instrument("anthropic")
    llm.script = [error(500)]
    client = _client(llm, "sync")
    runs: list[Any] = []

    @guard.run(agent="failing")
    def agent() -> None:
        runs.append(guard.current_run())
        client.messages.create(model=MODEL, messages=[ASK], max_tokens=64)

    with pytest.raises(anthropic.InternalServerError):
        agent()
    o = runs[0].outcome
    assert (o.status, o.reason, o.model_calls) == ("failed", "model_error", 1)


def test_outside_a_run_a_client_call_opens_no_run(sink, llm) -> None:
    guard.instrument("anthropic")
    llm.script = [text("hi", input=5, output=1)]
    reply = _client(llm, "sync").messages.create(model=MODEL, messages=[ASK], max_tokens=16)
    assert reply.content[0].text == "hi" and llm.count == 1
    assert sink.spans == ()  # no run, no step, no model-call span: a plain client is not an agent


def test_tools_the_loop_records_itself_are_not_counted_again(sink, llm) -> None:
    guard.instrument("anthropic")
    llm.script = [tool("lookup", {"q": "a"}), tool("lookup", {"q": "b"}), text("done")]

    @guard.tool
    def lookup(q: str) -> str:
        return f"result for {q}"

    @guard.run(agent="mixed")
    def agent() -> Any:
        _agent(llm, "sync", "create", {"lookup": lookup}, True).__wrapped__()
        return guard.current_run().usage()

    u = agent()
    assert (u.model_calls, u.tool_calls) == (3, 2)


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
