"""The ``anthropic`` integration with a second reporter of the same calls: the client's own
OpenTelemetry spans, OpenLLMetry's anthropic instrumentation (set up before or after
``guard.instrument()``), Pydantic AI's model layer, and a real guard's stored record. Each
call is counted once, with the exact tokens."""

from __future__ import annotations

import threading
import types
from typing import Any

import pytest
from _llm_server import text, tool
from _wait import wait_until as _wait
from test_anthropic import ASK, HOWS, MODEL, _ask_sync, _client, _turn

import guard
from guard.server import MemorySink, ServerThread


@pytest.mark.parametrize("client_spans", [False, True], ids=["integration", "two-reporters"])
def test_a_real_guard_cancel_stops_a_sync_loop_with_exact_tokens_in_the_stored_record(
    llm, client_spans
) -> None:
    """``client_spans``: the client's own OpenTelemetry spans on too (its default; they reach
    the guard through the SDK's provider): the stored record still counts the call once."""
    from guard.cli._client import AdminClient

    guard.instrument()
    llm.script = lambda body, api: tool(
        "lookup", {"q": str(len(llm.requests))}, input=70, output=30, cached=10, cache_write=5
    )
    store = MemorySink()
    with ServerThread(sink=store) as srv:
        guard.configure(endpoint=srv.address, admit_timeout_ms=3000)
        client = _client(llm, "sync", open_telemetry={"traces": client_spans})
        runs: list[Any] = []
        gate = llm.hold()

        def operator() -> None:
            assert gate.arrived.wait(10)
            AdminClient(srv.address).cancel(run_id=runs[0].run_id, reason="incident")
            _wait(lambda: runs[0].cancelled)  # the cancel reached the agent over its stream
            gate.release()

        @guard.run(agent="guarded", max_steps=200)
        def agent() -> None:
            runs.append(guard.current_run())
            messages: list[Any] = [ASK]
            while _turn(messages, _ask_sync(client, "create", messages), {"lookup": str}):
                pass

        t = threading.Thread(target=operator, daemon=True)
        t.start()
        with pytest.raises(guard.RunStopped) as stop:
            agent()
        t.join(10)
        o = stop.value.outcome
        assert o.reason == "operator_cancel" and llm.count == 1
        assert (o.input_tokens, o.output_tokens, o.cached_tokens) == (70, 30, 10)
        assert store.wait_for(lambda s: s.run(o.run_id) is not None)
        rec = store.run(o.run_id)
        assert (rec.input_tokens, rec.output_tokens, rec.cached_tokens, rec.model_calls) == (
            70,
            30,
            10,
            1,
        )
        seen = guard.stats()  # the client's span was seen, matched to the call, not recounted
        assert seen.get("foreign_duplicates", 0) == (1 if client_spans else 0), seen
        assert seen.get("foreign_model_calls", 0) == 0, seen
        guard.shutdown()


def test_the_clients_own_spans_and_the_integration_count_each_call_once(sink, llm) -> None:
    """The ``anthropic`` client emits its own GenAI span per call (a second reporter, with
    ``gen_ai.usage.input_tokens`` = the whole prompt too): with the integration on, the call
    is counted once; with it off, the SDK counts the client's span alone, to the same total."""
    llm.script = [text("ok", input=120, output=30, cached=20, cache_write=10)]
    client = _client(llm, "sync", open_telemetry={"tracer_provider": sink.provider})

    @guard.run(agent="two-reporters")
    def agent() -> Any:
        client.messages.create(model=MODEL, messages=[ASK], max_tokens=64)
        with client.messages.stream(model=MODEL, messages=[ASK], max_tokens=64) as s:
            s.until_done()
        return guard.current_run().usage()

    guard.instrument("anthropic")
    both = agent()
    guard.uninstrument()
    alone = agent()
    assert len(sink.named("anthropic.messages.create")) == 4  # the client reported every call
    for u in (both, alone):
        assert (u.model_calls, u.input_tokens, u.output_tokens, u.cached_tokens) == (
            2,
            240,
            60,
            40,
        )


@pytest.mark.parametrize("first", ["guard", "openllmetry"])
@pytest.mark.parametrize("how", HOWS)
def test_openllmetry_as_a_second_reporter_in_either_order(sink, llm, first, how) -> None:
    """OpenLLMetry's anthropic instrumentation wraps the same methods: set up before
    ``guard.instrument()`` (the guard's wrapper calls its ``wrapt`` wrapper, bound) or after
    (it wraps the guard's, and recognises the guarded stream), each call is guarded and
    counted once, its span matched to the integration's record."""
    oll = pytest.importorskip("opentelemetry.instrumentation.anthropic")
    instrumentor = oll.AnthropicInstrumentor()
    if first == "guard":
        guard.instrument("anthropic")
    instrumentor.instrument(tracer_provider=sink.provider)
    try:
        guard.instrument("anthropic")
        llm.script = [text("ok", input=120, output=30, cached=20, cache_write=10)]
        client = _client(llm, "sync", open_telemetry=False)  # OpenLLMetry is the second one

        @guard.run(agent="openllmetry")
        def agent() -> Any:
            _ask_sync(client, how, [ASK], max_tokens=64)
            return guard.current_run().usage()

        before = guard.stats()
        u = agent()
        after = guard.stats()
    finally:  # each unwraps its own layer: the last one on comes off first
        if first == "guard":
            instrumentor.uninstrument()
        guard.uninstrument()
        if first != "guard":
            instrumentor.uninstrument()
    from anthropic.resources.messages.messages import Messages

    create = vars(Messages)["create"]  # both layers off again, in either order
    assert type(create) is types.FunctionType and not hasattr(create, "__guard_original__")
    assert len(sink.named("anthropic.chat")) == 1  # OpenLLMetry reported the call
    assert (u.model_calls, u.steps, u.input_tokens, u.output_tokens, u.cached_tokens) == (
        1,
        1,
        120,
        30,
        20,
    )
    assert after["foreign_duplicates"] == before.get("foreign_duplicates", 0) + 1
    assert after.get("foreign_model_calls", 0) == before.get("foreign_model_calls", 0)


def test_pydantic_ais_anthropic_model_is_counted_once_with_every_integration_on(sink, llm) -> None:
    """Pydantic AI's Anthropic model calls ``client.beta.messages``, which this integration
    leaves alone: Pydantic AI's model layer counts it, once (were both layers to count it,
    the record would say 2 calls and 240 input tokens)."""
    pytest.importorskip("pydantic_ai.models.anthropic")
    from pydantic_ai import Agent
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.providers.anthropic import AnthropicProvider

    assert {"anthropic", "pydantic_ai"} <= set(guard.instrument())
    llm.script = [text("ok", input=120, output=30, cached=20, cache_write=10)]
    provider = AnthropicProvider(anthropic_client=_client(llm, "async"))
    agent = Agent(AnthropicModel(MODEL, provider=provider))

    @guard.run(agent="pydantic-ai-anthropic")
    def run() -> Any:
        assert agent.run_sync("hi").output == "ok"
        return guard.current_run().usage()

    u = run()
    assert llm.count == 1
    assert (u.model_calls, u.input_tokens, u.output_tokens, u.cached_tokens) == (1, 120, 30, 20)
