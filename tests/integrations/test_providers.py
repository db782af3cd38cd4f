"""The contract every model client integration keeps, with the real ``openai`` and
``anthropic`` clients against the scripted server: one case per provider and variant, over
the adapters of ``_providers.py``. What only one client has stays in ``test_openai.py`` /
``test_anthropic.py``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from _llm_server import error, text, tool
from _providers import PROVIDERS, cases
from test_openai import _cancel_when_held

import guard

BY_PROVIDER = [pytest.param(p, id=p.name) for p in PROVIDERS]


def _in_run(mode: str, calls: Callable[[], Any], *, repeat: bool = False, **run: Any) -> Any:
    """``calls()`` inside a ``@guard.run`` of ``mode`` (awaited in an async one), again and
    again with ``repeat`` (until the run stops); returns what the first ``calls()`` did."""
    if mode == "sync":

        @guard.run(**run)
        def agent() -> Any:
            first = calls()
            while repeat:
                calls()
            return first

        return agent()

    @guard.run(**run)
    async def aagent() -> Any:
        first = await calls()
        while repeat:
            await calls()
        return first

    return asyncio.run(aagent())


@pytest.mark.parametrize(("p", "v"), cases("variants"))
def test_a_runaway_loop_is_stopped_as_loop_detected(sink, llm, p, v) -> None:
    """Varying arguments, the same result: stopped before the next request leaves, each
    call fingerprinted in-process (by ``@guard.tool``, or read back from the conversation)."""
    guard.instrument(p.name)
    llm.script = p.varying
    agent = p.loop(llm, v, {"lookup": p.loop_tool}, True, max_steps=60)
    with pytest.raises(guard.RunStopped) as stop:
        agent()
    o = stop.value.outcome
    assert o.reason == "loop_detected", o.message
    assert o.model_calls == llm.count < 60 and o.tool_calls == o.model_calls
    assert o.steps == o.model_calls  # one inferred step per model turn (+ its tools)
    assert (
        len(sink.named("guard.step")) == o.steps
    )  # every inferred step ended, the last at run end
    assert "refund policy variant" not in sink.dump()  # only fingerprints leave
    tools = sink.attributes("execute_tool")
    assert tools and all(a["guard.action.fingerprint"] and a["guard.result.hash"] for a in tools)
    if not p.converses:  # a loop that resends its first turn: the same request every time
        assert len({json.dumps(b, sort_keys=True) for _, b in llm.requests}) == 1


@pytest.mark.parametrize(("p", "v"), cases("variants"))
def test_token_budget_with_exact_tokens_in_the_record(sink, llm, p, v) -> None:
    """The record's tokens are the server's, mapped to the guard's terms (Anthropic's input
    tokens leave out cache reads and writes: 300 = 240 + 40 read + 20 written)."""
    guard.instrument(p.name)
    u = {"input": 300, "output": 100, "cached": 40, "reasoning": 25}
    if p.cache_write:
        u["cache_write"] = 20
    llm.script = [tool("lookup", {"q": "a"}, **u)]
    tools = {"lookup": lambda q: q}  # a fresh result each time would be progress: no loop
    agent = p.loop(llm, v, tools, False, max_tokens=1_500, max_steps=50)
    with pytest.raises(guard.RunStopped) as stop:
        agent(**p.call_kw)
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
    ids = [a.get("gen_ai.response.id") for op in ("chat", "responses") for a in sink.attributes(op)]
    assert len(ids) == n and len(set(ids)) == n  # each call once, with its id
    assert all(i.startswith(p.id_prefix(v)) for i in ids)


@pytest.mark.parametrize("p", BY_PROVIDER)
def test_a_reservation_of_max_tokens_refuses_the_call_before_it_leaves(sink, llm, p) -> None:
    guard.instrument(p.name)
    llm.script = [text("done", input=10, output=10)]
    client = p.client(llm, "sync")
    with pytest.raises(guard.RunStopped) as stop:
        _in_run("sync", lambda: p.reserve_twice(client), agent="reserving", max_tokens=1_000)
    assert stop.value.outcome.reason == "token_budget"
    assert "reservation refused" in stop.value.outcome.message
    assert llm.count == 1 and stop.value.outcome.input_tokens == 10


@pytest.mark.parametrize(("p", "v"), cases("cancels"))
def test_at_most_the_call_in_flight_completes_after_a_cancel(sink, llm, p, v) -> None:
    guard.instrument(p.name)
    llm.script = lambda body, api: tool("lookup", {"q": str(len(llm.requests))})
    gate = llm.hold()  # the first request is held: the cancel lands while it is in flight
    runs: list[Any] = []
    client = p.client(llm, p.mode(v))

    def call() -> Any:
        runs.append(guard.current_run())
        return p.ask(client, v)

    t = _cancel_when_held(gate, runs, lambda r: r.cancel("user_cancel"))
    with pytest.raises(guard.RunStopped) as stop:
        _in_run(p.mode(v), call, repeat=True, agent="cancelled", max_steps=100)
    t.join(10)
    assert stop.value.outcome.reason == "user_cancel"
    assert llm.count == 1  # the held call was the one in flight; none left after the cancel


@pytest.mark.parametrize(("p", "v"), cases("streams"))
def test_a_stream_raises_at_the_next_item_after_a_cancel_and_closes_the_response(
    sink, llm, p, v
) -> None:
    guard.instrument(p.name)
    llm.script = [text("a long answer that keeps streaming " * 4, input=50, output=40)]
    gate = llm.hold(after_events=3)
    client = p.client(llm, p.mode(v))
    seen: list[Any] = []

    def see(item: Any) -> None:
        seen.append(item)
        if len(seen) == p.cut_at:
            guard.current_run().cancel("user_cancel")  # the gate still holds the rest

    def read(items: Any) -> None:
        for item in items:
            see(item)

    async def aread(items: Any) -> None:
        async for item in items:
            see(item)

    reader = read if p.mode(v) == "sync" else aread
    with gate.held(), pytest.raises(guard.RunStopped) as stop:
        _in_run(p.mode(v), lambda: p.read_stream(client, v, reader), agent="streamer")
    o = stop.value.outcome
    assert o.reason == "user_cancel" and len(seen) == p.cut_at
    assert gate.disconnected.wait(10)  # the HTTP response was closed, not read to its end
    assert o.model_calls == 1 and llm.count == 1
    if p.tokens_at_cut is not None:
        assert o.input_tokens == p.tokens_at_cut  # the usage seen before the cut


@pytest.mark.parametrize("p", BY_PROVIDER)
def test_a_model_error_that_ends_the_run_is_recorded_as_model_error(sink, llm, p) -> None:
    guard.instrument(p.name)
    llm.script = [error(500)]
    client = p.client(llm, "sync")
    runs: list[Any] = []

    def call() -> None:
        runs.append(guard.current_run())
        p.plain(client)

    with pytest.raises(p.error):
        _in_run("sync", call, agent="failing")
    o = runs[0].outcome
    assert (o.status, o.reason, o.model_calls) == ("failed", "model_error", 1)


@pytest.mark.parametrize("p", BY_PROVIDER)
def test_outside_a_run_a_client_call_opens_no_run(sink, llm, p) -> None:
    guard.instrument(p.name)
    llm.script = [text("hi", input=5, output=1)]
    reply = p.plain(p.client(llm, "sync"))
    assert p.text(reply) == "hi" and llm.count == 1
    assert sink.spans == ()  # no run, no step, no model-call span: a plain client is not an agent


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("p", BY_PROVIDER)
def test_raw_responses_are_recorded_when_parsed(sink, llm, p, mode) -> None:
    """``with_raw_response`` and ``with_streaming_response``: the call is recorded once, with
    its usage, when the body is parsed (on the async client parse() may be a coroutine: it
    is awaited, never left pending), and a streamed body comes back guarded."""
    guard.instrument(p.name)
    llm.script = [text("ok", input=50, output=5)]
    client = p.client(llm, mode)

    def calls() -> Any:
        if mode == "sync":
            p.raw_sync(client)
            return guard.current_run().usage()

        async def parsed() -> Any:
            await p.raw_async(client)
            return guard.current_run().usage()

        return parsed()

    o = _in_run(mode, calls, agent="raw")
    assert llm.count == 2
    assert (o.model_calls, o.input_tokens, o.output_tokens) == (2, 100, 10)


@pytest.mark.parametrize(("p", "which"), cases("conversations"))
def test_a_hand_written_loop_needs_no_guard_tool(sink, llm, p, which) -> None:
    """Its tool calls are read back from the conversation it sends: fingerprinted in-process
    (no raw argument on a span) and fed to loop detection, which stops the runaway search
    before the next request leaves."""
    guard.instrument(p.name)
    llm.script = p.varying

    def search(q: str) -> str:  # a plain function: no @guard.tool
        return "no results"

    with pytest.raises(guard.RunStopped) as stop:
        p.conversation(llm, which, search, max_steps=50)()
    o = stop.value.outcome
    assert o.reason == "loop_detected", o.message
    assert o.tool_calls == o.model_calls == llm.count  # each tool once; nothing after the stop
    assert "refund policy variant" not in sink.dump()  # only fingerprints leave


@pytest.mark.parametrize(("p", "which"), cases("conversations"))
def test_tools_the_loop_records_itself_are_not_counted_again(sink, llm, p, which) -> None:
    guard.instrument(p.name)
    llm.script = [tool("lookup", {"q": "a"}), tool("lookup", {"q": "b"}), text("done")]

    @guard.tool
    def recorded(q: str) -> str:
        return f"result for {q}"

    @guard.run(agent="mixed")
    def agent() -> Any:
        p.conversation(llm, which, recorded).__wrapped__()
        return guard.current_run().usage()

    u = agent()
    assert (u.model_calls, u.tool_calls) == (3, 2)
