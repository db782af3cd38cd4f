"""The ``openai`` integration with the real ``openai`` client against the scripted server:
the hand-written loops (chat completions and responses, sync and async, plain and
streaming) that the contract suite ``test_providers.py`` runs, and what only this client
has here (tools admitted through the base, a real guard's cancel)."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import openai
import pytest
from _llm_server import LLMServer, tool
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


def _cancel_when_held(gate: Any, runs: list[Any], cancel: Any) -> threading.Thread:
    def go() -> None:
        assert gate.arrived.wait(10)
        cancel(runs[0])
        gate.release()

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


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
