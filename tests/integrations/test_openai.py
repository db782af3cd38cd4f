"""The ``openai`` integration with the real ``openai`` client against the scripted server:
chat completions and responses, sync and async, plain and streaming."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import openai
import pytest
from _llm_server import LLMServer, error, text, tool
from _wait import wait_until

import guard
from guard.integrations._base import admit_tool
from guard.server import MemorySink, ServerThread

VARIANTS = [
    (api, mode, stream)
    for api in ("chat", "responses")
    for mode in ("sync", "async")
    for stream in (False, True)
]
IDS = [f"{a}-{m}{'-stream' if s else ''}" for a, m, s in VARIANTS]
MSG = [{"role": "user", "content": "find the refund policy"}]


def _client(llm: LLMServer, mode: str) -> Any:
    cls = openai.OpenAI if mode == "sync" else openai.AsyncOpenAI
    return cls(base_url=llm.base_url, api_key="test", max_retries=0)


def _calls_chat(message: Any) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or ()]


def _read_sync(client: Any, api: str, stream: bool, **kw: Any) -> list[tuple[str, str]]:
    """One model call; returns the tool calls asked for as (name, JSON arguments)."""
    if api == "chat":
        if not stream:
            return _calls_chat(
                client.chat.completions.create(model="gpt-4.1", messages=MSG, **kw)
                .choices[0]
                .message
            )
        calls = []
        for chunk in client.chat.completions.create(
            model="gpt-4.1", messages=MSG, stream=True, **kw
        ):
            for c in chunk.choices[0].delta.tool_calls or ():
                calls.append((c.function.name, c.function.arguments))
        return calls
    if not stream:
        resp = client.responses.create(model="gpt-4.1", input="x", **kw)
    else:
        with client.responses.stream(model="gpt-4.1", input="x", **kw) as s:
            for _ in s:
                pass
            resp = s.get_final_response()
    return [(i.name, i.arguments) for i in resp.output if i.type == "function_call"]


async def _read_async(client: Any, api: str, stream: bool, **kw: Any) -> list[tuple[str, str]]:
    if api == "chat":
        if not stream:
            r = await client.chat.completions.create(model="gpt-4.1", messages=MSG, **kw)
            return _calls_chat(r.choices[0].message)
        calls = []
        s = await client.chat.completions.create(model="gpt-4.1", messages=MSG, stream=True, **kw)
        async for chunk in s:
            for c in chunk.choices[0].delta.tool_calls or ():
                calls.append((c.function.name, c.function.arguments))
        return calls
    if not stream:
        resp = await client.responses.create(model="gpt-4.1", input="x", **kw)
    else:
        async with client.responses.stream(model="gpt-4.1", input="x", **kw) as s:
            async for _ in s:
                pass
            resp = await s.get_final_response()
    return [(i.name, i.arguments) for i in resp.output if i.type == "function_call"]


def _agent(llm: LLMServer, api: str, mode: str, stream: bool, tools: dict[str, Any], **limits: Any):
    """A hand-written agent loop with no guard.step: call the model, run the tools it asks
    for, repeat until it answers. Only ``guard.instrument()`` + ``@guard.run``."""
    client = _client(llm, mode)
    if mode == "sync":

        @guard.run(agent=f"openai-{api}", **limits)
        def run_sync(**kw: Any) -> str:
            while calls := _read_sync(client, api, stream, **kw):
                for name, args in calls:
                    tools[name](**json.loads(args))
            return "answered"

        return run_sync

    @guard.run(agent=f"openai-{api}", **limits)
    async def run_async(**kw: Any) -> str:
        while calls := await _read_async(client, api, stream, **kw):
            for name, args in calls:
                tools[name](**json.loads(args))
        return "answered"

    return lambda **kw: asyncio.run(run_async(**kw))


@guard.tool
def lookup(q: str) -> str:
    return "no results"  # the same result whatever the query: a runaway search


def _varying(body: dict[str, Any], api: str) -> Any:
    return tool("lookup", {"q": f"refund policy variant {len(str(body))}-{id(body)}"})


@pytest.mark.parametrize(("api", "mode", "stream"), VARIANTS, ids=IDS)
def test_a_runaway_loop_is_stopped_as_loop_detected(sink, llm, api, mode, stream) -> None:
    guard.instrument("openai")
    llm.script = _varying
    agent = _agent(llm, api, mode, stream, {"lookup": lookup}, max_steps=60)
    with pytest.raises(guard.RunStopped) as stop:
        agent()
    o = stop.value.outcome
    assert o.reason == "loop_detected", o.message
    assert o.model_calls == llm.count < 60 and o.tool_calls == o.model_calls
    assert o.steps == o.model_calls  # one inferred step per model turn (+ its tools)
    assert len({json.dumps(b, sort_keys=True) for _, b in llm.requests}) == 1  # same request
    step_spans = sink.named("guard.step")
    assert len(step_spans) == o.steps  # every inferred step ended, the last one at run end


def test_tools_admitted_by_the_base_are_fingerprinted_and_feed_loop_detection(sink, llm) -> None:
    guard.instrument("openai")
    llm.script = lambda body, api: tool("lookup", {"q": f"secret-query-{len(llm.requests)}"})
    client = _client(llm, "sync")

    @guard.run(agent="framework-like", max_steps=60)
    def agent() -> None:
        while True:
            reply = client.chat.completions.create(model="gpt-4.1", messages=MSG)
            for c in reply.choices[0].message.tool_calls:
                call = admit_tool(c.function.name, c.function.arguments)  # JSON text
                call.done("no results", call_id=c.id)

    with pytest.raises(guard.RunStopped) as stop:
        agent()
    assert stop.value.outcome.reason == "loop_detected"
    tools = sink.attributes("execute_tool")
    assert tools and all(a["guard.action.fingerprint"] and a["guard.result.hash"] for a in tools)
    assert "secret-query" not in sink.dump()  # the raw arguments never leave


@pytest.mark.parametrize(("api", "mode", "stream"), VARIANTS, ids=IDS)
def test_token_budget_with_exact_tokens_in_the_record(sink, llm, api, mode, stream) -> None:
    guard.instrument("openai")
    llm.script = [tool("lookup", {"q": "a"}, input=300, output=100, cached=40, reasoning=25)]
    tools = {"lookup": lambda q: q}  # a fresh result each time would be progress: no loop
    agent = _agent(llm, api, mode, stream, tools, max_tokens=1_500, max_steps=50)
    with pytest.raises(guard.RunStopped) as stop:
        agent()
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
    ids = [a.get("gen_ai.response.id") for a in sink.attributes("chat")] + [
        a.get("gen_ai.response.id") for a in sink.attributes("responses")
    ]
    assert len([i for i in ids if i]) == n and len(set(ids)) == n  # each call once, its id


def test_a_reservation_of_max_tokens_refuses_the_call_before_it_leaves(sink, llm) -> None:
    guard.instrument("openai")
    llm.script = [text("done", input=10, output=10)]
    client = _client(llm, "sync")

    @guard.run(agent="reserving", max_tokens=1_000)
    def agent() -> None:
        client.chat.completions.create(model="gpt-4.1", messages=MSG, max_tokens=200)
        client.chat.completions.create(model="gpt-4.1", messages=MSG, max_completion_tokens=5_000)

    with pytest.raises(guard.RunStopped) as stop:
        agent()
    assert stop.value.outcome.reason == "token_budget"
    assert "reservation refused" in stop.value.outcome.message
    assert llm.count == 1 and stop.value.outcome.input_tokens == 10


def _cancel_when_held(gate: Any, runs: list[Any], cancel: Any) -> threading.Thread:
    def go() -> None:
        assert gate.arrived.wait(10)
        cancel(runs[0])
        gate.release()

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_at_most_the_call_in_flight_completes_after_a_local_cancel(sink, llm, mode) -> None:
    guard.instrument("openai")
    llm.script = lambda body, api: tool("lookup", {"q": str(len(llm.requests))})
    gate = llm.hold()  # the first request is held: the cancel lands while it is in flight
    runs: list[Any] = []
    client = _client(llm, mode)

    if mode == "sync":

        @guard.run(agent="cancelled", max_steps=100)
        def agent() -> None:
            runs.append(guard.current_run())
            while True:
                client.chat.completions.create(model="gpt-4.1", messages=MSG)

        t = _cancel_when_held(gate, runs, lambda r: r.cancel("user_cancel"))
        with pytest.raises(guard.RunStopped) as stop:
            agent()
    else:

        @guard.run(agent="cancelled", max_steps=100)
        async def aagent() -> None:
            runs.append(guard.current_run())
            while True:
                await client.chat.completions.create(model="gpt-4.1", messages=MSG)

        t = _cancel_when_held(gate, runs, lambda r: r.cancel("user_cancel"))
        with pytest.raises(guard.RunStopped) as stop:
            asyncio.run(aagent())
    t.join(10)
    assert stop.value.outcome.reason == "user_cancel"
    assert llm.count == 1  # the held call was the one in flight; none left after the cancel


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_a_stream_raises_at_the_next_chunk_after_a_cancel_and_closes_the_response(
    sink, llm, api
) -> None:
    guard.instrument("openai")
    llm.script = [text("a long answer that keeps streaming " * 4, input=50, output=40)]
    gate = llm.hold(after_events=3)
    client = _client(llm, "sync")
    seen: list[Any] = []

    @guard.run(agent="streamer")
    def agent() -> None:
        run = guard.current_run()
        if api == "chat":
            s = client.chat.completions.create(model="gpt-4.1", messages=MSG, stream=True)
        else:
            s = client.responses.create(model="gpt-4.1", input="x", stream=True)
        for item in s:
            seen.append(item)
            if len(seen) == 3:
                run.cancel("user_cancel")  # the gate still holds the rest

    with gate.held(), pytest.raises(guard.RunStopped) as stop:
        agent()
    assert stop.value.outcome.reason == "user_cancel" and len(seen) == 3
    assert gate.disconnected.wait(10)  # the HTTP response was closed, not read to its end
    assert stop.value.outcome.model_calls == 1 and llm.count == 1


def test_a_real_guard_cancel_stops_a_sync_loop_with_exact_tokens_in_the_stored_record(llm) -> None:
    from guard.cli._client import AdminClient

    guard.instrument()
    llm.script = lambda body, api: tool(
        "lookup", {"q": str(len(llm.requests))}, input=70, output=30
    )
    store = MemorySink()
    with ServerThread(sink=store) as srv:
        guard.configure(endpoint=srv.address, admit_timeout_ms=3000)
        client = _client(llm, "sync")
        runs: list[Any] = []
        gate = llm.hold()

        def operator() -> None:
            assert gate.arrived.wait(10)
            AdminClient(srv.address).cancel(run_id=runs[0].run_id, reason="incident")
            try:  # the cancel reached the agent over its stream
                wait_until(lambda: runs[0].cancelled, 10, "the cancel to reach the run")
            finally:
                gate.release()

        @guard.run(agent="guarded", max_steps=200)
        def agent() -> None:
            runs.append(guard.current_run())
            while True:
                for c in (
                    client.chat.completions.create(model="gpt-4.1", messages=MSG)
                    .choices[0]
                    .message.tool_calls
                ):
                    lookup(**json.loads(c.function.arguments))

        t = threading.Thread(target=operator, daemon=True)
        t.start()
        with pytest.raises(guard.RunStopped) as stop:
            agent()
        t.join(10)
        o = stop.value.outcome
        assert o.reason == "operator_cancel" and llm.count == 1
        assert store.wait_for(lambda s: s.run(o.run_id) is not None)
        rec = store.run(o.run_id)
        assert (rec.input_tokens, rec.output_tokens, rec.model_calls) == (70, 30, 1)
        guard.shutdown()


def test_a_model_error_that_ends_the_run_is_recorded_as_model_error(sink, llm) -> None:
    guard.instrument("openai")
    llm.script = [error(500)]
    client = _client(llm, "sync")
    runs: list[Any] = []

    @guard.run(agent="failing")
    def agent() -> None:
        runs.append(guard.current_run())
        client.chat.completions.create(model="gpt-4.1", messages=MSG)

    with pytest.raises(openai.InternalServerError):
        agent()
    o = runs[0].outcome
    assert (o.status, o.reason, o.model_calls) == ("failed", "model_error", 1)


def test_outside_a_run_a_client_call_opens_no_run(sink, llm) -> None:
    guard.instrument("openai")
    llm.script = [text("hi", input=5, output=1)]
    reply = _client(llm, "sync").chat.completions.create(model="gpt-4.1", messages=MSG)
    assert reply.choices[0].message.content == "hi" and llm.count == 1
    assert sink.spans == ()  # no run, no step, no model-call span: a plain client is not an agent


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_raw_responses_are_recorded_when_parsed(sink, llm, mode) -> None:
    """``with_raw_response`` and ``with_streaming_response``: the call is recorded once, with
    its usage, when the body is parsed (on the async client parse() is a coroutine: it used
    to be called and never awaited, recording 0 tokens), and a streamed body comes back
    guarded."""
    guard.instrument("openai")
    llm.script = [text("ok", input=50, output=5)]
    client = _client(llm, mode)

    @guard.run(agent="raw")
    async def agent_async() -> Any:
        raw = await client.chat.completions.with_raw_response.create(model="gpt-4.1", messages=MSG)
        assert raw.headers is not None  # the client's own response, passed through
        raw.parse()  # the client's legacy raw response: parse() is not a coroutine here
        raw.parse()  # cached: still one call
        async with client.responses.with_streaming_response.create(
            model="gpt-4.1", input="x", stream=True
        ) as resp:
            async for _ in await resp.parse():
                pass
        return guard.current_run().usage()

    @guard.run(agent="raw")
    def agent_sync() -> Any:
        raw = client.chat.completions.with_raw_response.create(model="gpt-4.1", messages=MSG)
        raw.parse()
        raw.parse()
        with client.responses.with_streaming_response.create(
            model="gpt-4.1", input="x", stream=True
        ) as resp:
            for _ in resp.parse():
                pass
        return guard.current_run().usage()

    o = asyncio.run(agent_async()) if mode == "async" else agent_sync()
    assert llm.count == 2
    assert (o.model_calls, o.input_tokens, o.output_tokens) == (2, 100, 10)


def _conversation_loop(llm: LLMServer, api: str, tool_fn: Any, **limits: Any):
    """The loop a user writes: send the conversation, run the tools the model asks for with
    plain functions, append their results, repeat. Only ``guard.instrument()`` +
    ``@guard.run``: no ``@guard.tool``, no ``guard.step``."""
    client = _client(llm, "sync")

    @guard.run(agent=f"conversation-{api}", **limits)
    def agent() -> str:
        if api == "chat":
            messages: list[Any] = list(MSG)
            while True:
                msg = client.chat.completions.create(model="gpt-4.1", messages=messages)
                msg = msg.choices[0].message
                if not msg.tool_calls:
                    return msg.content or ""
                messages.append(msg.model_dump(exclude_none=True))
                for c in msg.tool_calls:
                    out = tool_fn(**json.loads(c.function.arguments))
                    messages.append({"role": "tool", "tool_call_id": c.id, "content": out})
        items: list[Any] = [{"role": "user", "content": "find the refund policy"}]
        while True:
            resp = client.responses.create(model="gpt-4.1", input=items)
            calls = [i for i in resp.output if i.type == "function_call"]
            if not calls:
                return resp.output_text
            for c in calls:
                items.append(
                    {"type": "function_call", "call_id": c.call_id, "name": c.name,
                     "arguments": c.arguments}
                )  # fmt: skip
                out = tool_fn(**json.loads(c.arguments))
                items.append({"type": "function_call_output", "call_id": c.call_id, "output": out})

    return agent


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_a_hand_written_loop_needs_no_guard_tool(sink, llm, api) -> None:
    """Its tool calls are read back from the conversation it sends: fingerprinted in-process
    (no raw argument on a span) and fed to loop detection, which stops the runaway search
    before the next request leaves."""
    guard.instrument("openai")
    llm.script = _varying

    def search(q: str) -> str:  # a plain function: no @guard.tool
        return "no results"

    with pytest.raises(guard.RunStopped) as stop:
        _conversation_loop(llm, api, search, max_steps=50)()
    o = stop.value.outcome
    assert o.reason == "loop_detected", o.message
    assert o.tool_calls == o.model_calls == llm.count  # each tool once; nothing after the stop
    assert "refund policy variant" not in sink.dump()  # only fingerprints leave


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_tools_the_loop_records_itself_are_not_counted_again(sink, llm, api) -> None:
    guard.instrument("openai")
    llm.script = [tool("lookup", {"q": "a"}), tool("lookup", {"q": "b"}), text("done")]

    @guard.tool
    def recorded(q: str) -> str:
        return f"result for {q}"

    @guard.run(agent="mixed")
    def agent() -> Any:
        _conversation_loop(llm, api, recorded).__wrapped__()
        return guard.current_run().usage()

    u = agent()
    assert (u.model_calls, u.tool_calls) == (3, 2)
