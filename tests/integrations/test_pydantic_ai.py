"""The Pydantic AI integration with the real library on the local OpenAI-compatible server:
a runaway loop stopped, a token budget, exact tokens counted once (whichever layer counts, and
with the framework's own OpenTelemetry instrumentation on too), steps inferred, every entry
point raising ``RunStopped``, and runs named after the agent outside a ``@guard.run``."""

from __future__ import annotations

import itertools

import pytest
from _llm_server import text, tool
from _pydantic_ai_help import MODES, agent_on, finishing, runaway
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import SpanProcessor
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.capabilities import Instrumentation
from pydantic_ai.messages import ModelResponse, ToolCallPart
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.models.instrumented import InstrumentationSettings
from pydantic_ai.usage import RequestUsage

import guard
from guard.integrations._base import COUNTED_KEY
from guard.server import MemorySink, ServerThread
from guard.testing import capture_spans


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("mode", MODES, ids="+".join)
def test_runaway_loop_is_stopped_as_loop_detected_and_counted_once(sink, llm, mode, api) -> None:
    assert guard.instrument(*mode) == list(mode)
    llm.script = runaway(input=100, output=10)
    agent = agent_on(llm, api)
    with pytest.raises(guard.RunStopped) as stop:
        agent.run_sync("where is my refund?")  # outside any @guard.run: a run of its own
    o = stop.value.outcome
    assert (o.status, o.reason) == ("terminated", "loop_detected"), o.message
    assert o.agent == "bot"  # named after the framework's agent
    assert o.model_calls == llm.count  # once each, and no request left after the stop
    assert (o.input_tokens, o.output_tokens) == (100 * llm.count, 10 * llm.count)
    assert o.tool_calls == llm.count and o.steps == llm.count  # one model turn + its tool
    assert llm.count < 10


@pytest.mark.parametrize("mode", MODES, ids="+".join)
async def test_a_token_budget_stops_an_async_run_inside_a_guard_run(sink, llm, mode) -> None:
    guard.instrument(*mode)
    # New arguments and new results every turn (no loop): only the budget can stop it.
    llm.script = [tool("status", {"q": f"order {i}"}, input=200, output=20) for i in range(50)]
    agent = agent_on(llm, model_settings={"max_tokens": 20})

    @agent.tool_plain
    def status(q: str) -> str:
        return q

    @guard.run(agent="budgeted", max_tokens=1000)
    async def handle() -> str:
        return (await agent.run("refund?")).output

    with pytest.raises(guard.RunStopped) as stop:
        await handle()
    o = stop.value.outcome
    assert (o.reason, o.agent) == ("token_budget", "budgeted")  # attached to the active run
    assert o.model_calls == llm.count and o.input_tokens + o.output_tokens == 220 * llm.count
    assert o.input_tokens + o.output_tokens <= 1000 + 220  # at most the call that crossed it
    assert llm.count <= 5


@pytest.mark.parametrize("mode", MODES, ids="+".join)
def test_a_request_whose_max_tokens_cannot_be_covered_never_leaves(sink, llm, mode) -> None:
    guard.instrument(*mode)
    llm.script = [tool("status", {"q": f"order {i}"}, input=300, output=1) for i in range(9)]
    agent = agent_on(llm, model_settings={"max_tokens": 450})

    @agent.tool_plain
    def status(q: str) -> str:
        return q

    @guard.run(agent="reserved", max_tokens=1000)
    def handle() -> str:
        return agent.run_sync("refund?").output

    with pytest.raises(guard.RunStopped) as stop:
        handle()
    o = stop.value.outcome
    # Each request reserves its prompt (the instructions, tool schema and conversation: a few
    # hundred tokens at most here) plus its 450 max tokens: after two calls (602 used) the
    # third cannot be covered and is refused before it leaves (unreserved, 4 calls would leave).
    assert o.reason == "token_budget", o.message
    assert llm.count == o.model_calls == 2 and o.input_tokens + o.output_tokens == 602
    assert "reservation refused" in o.message, o.message


@pytest.mark.parametrize(
    "reporters",
    [("pydantic_ai",), ("openai", "pydantic_ai"), ("pydantic_ai", "framework-otel")],
    ids="+".join,
)
def test_exact_tokens_in_the_guards_record_and_in_run_stopped(llm, reporters) -> None:
    guard.instrument(*[r for r in reporters if r != "framework-otel"])
    llm.script = [
        tool("lookup", {"q": f"order {i}"}, input=300, output=40, cached=120, reasoning=15)
        for i in range(40)
    ]
    store = MemorySink()
    with ServerThread(sink=store) as srv:
        with capture_spans(endpoint=srv.address, hmac_key=b"test-key-0123456789") as spans:
            caps = []
            if "framework-otel" in reporters:  # its own gen_ai chat / execute_tool spans too
                settings = InstrumentationSettings(tracer_provider=spans.provider)
                caps = [Instrumentation(settings=settings)]
            agent = agent_on(llm, capabilities=caps)
            with pytest.raises(guard.RunStopped) as stop:
                agent.run_sync("refund?")
            guard.shutdown()  # waits for the record's acknowledgement
            if caps:
                assert any(s.name.startswith("chat ") for s in spans.spans)
        o = stop.value.outcome
        assert store.wait_for(lambda s: s.run(o.run_id) is not None)
        row = store.run(o.run_id)
    n = llm.count
    want = (n, 300 * n, 40 * n, 120 * n, 15 * n)
    for rec in (o, row):
        got = (rec.model_calls, rec.input_tokens, rec.output_tokens)
        assert (*got, rec.cached_tokens, rec.reasoning_tokens) == want, rec
    assert row.reason == "loop_detected" and row.agent == "bot"


async def test_a_completed_run_returns_its_output_unchanged(sink, llm) -> None:
    guard.instrument("pydantic_ai")
    llm.script = finishing(2, input=50, output=5)
    agent = agent_on(llm)
    out = await agent.run("refund?")
    assert out.output == "done" and llm.count == 3
    (run,) = [s for s in sink.spans if s.name == "invoke_agent bot" and _is_guard(s)]
    assert run.attributes["guard.stop.reason"] == "final_answer"
    assert run.attributes["gen_ai.agent.name"] == "bot"


def _is_guard(span) -> bool:
    return "guard.run.id" in (span.attributes or {})


def test_two_framework_runs_inside_one_guard_run_are_one_run(sink, llm) -> None:
    guard.instrument("pydantic_ai")
    llm.script = [text("a", input=10, output=1), text("b", input=20, output=2)]
    agent = agent_on(llm)

    @guard.run(agent="outer", max_model_calls=1)
    def handle() -> None:
        agent.run_sync("first")
        agent.run_sync("second")  # the run's budget is shared: this one is refused

    with pytest.raises(guard.RunStopped) as stop:
        handle()
    o = stop.value.outcome
    assert (o.agent, o.model_calls, o.input_tokens) == ("outer", 1, 10)
    assert llm.count == 1


async def _drive(entry: str, agent) -> None:
    if entry == "run":
        await agent.run("refund?")
    elif entry == "run_stream":
        async with agent.run_stream("refund?") as res:
            await res.get_output()
    elif entry == "iter":
        async with agent.iter("refund?") as agent_run:
            async for _ in agent_run:
                pass
    else:
        async with agent.run_stream_events("refund?") as events:
            async for _ in events:
                pass


@pytest.mark.parametrize("mode", MODES, ids="+".join)
@pytest.mark.parametrize("entry", ["run", "run_stream", "iter", "run_stream_events"])
async def test_run_stopped_comes_out_of_every_async_entry_point(sink, llm, entry, mode) -> None:
    guard.instrument(*mode)
    llm.script = runaway(input=100, output=10, cached=30, reasoning=4)
    agent = agent_on(llm)
    with pytest.raises(guard.RunStopped) as stop:
        await _drive(entry, agent)
    o = stop.value.outcome
    assert o.reason == "loop_detected" and o.model_calls == llm.count
    n = llm.count  # streamed or not, the usage of every call, once
    assert (o.input_tokens, o.output_tokens, o.cached_tokens, o.reasoning_tokens) == (
        100 * n,
        10 * n,
        30 * n,
        4 * n,
    )


def test_a_model_retry_loop_never_becomes_another_retry_prompt(sink, llm) -> None:
    guard.instrument("pydantic_ai")
    agent = agent_on(llm, name="retrier", retries={"tools": 1000})

    @agent.tool_plain
    def refund(q: str) -> str:
        raise ModelRetry("the refund service is down, try again")

    n = itertools.count()
    llm.script = lambda body, api: tool("refund", {"q": f"order {next(n)}"}, input=100, output=10)
    with pytest.raises(guard.RunStopped) as stop:
        agent.run_sync("refund?")
    o = stop.value.outcome
    assert o.reason in ("loop_detected", "no_progress"), o.message
    assert o.model_calls == llm.count < 12  # the stop left before another request


def test_a_model_without_the_openai_client_is_counted_at_the_model_layer(sink) -> None:
    guard.instrument()  # openai on too: this model never calls it, so the model layer counts
    turns = itertools.count(1)

    def model(messages, info) -> ModelResponse:
        n = next(turns)
        return ModelResponse(
            parts=[ToolCallPart("lookup", {"q": f"order {n}"}, tool_call_id=f"c{n}")],
            usage=RequestUsage(input_tokens=70, output_tokens=7, cache_read_tokens=20),
            provider_response_id=f"resp-{n}",
        )

    agent = Agent(FunctionModel(model), name="local-model")

    @agent.tool_plain
    def lookup(q: str) -> str:
        return "no such order"

    with pytest.raises(guard.RunStopped) as stop:
        agent.run_sync("refund?")
    o = stop.value.outcome
    calls = next(turns) - 1
    assert (o.reason, o.agent, o.model_calls) == ("loop_detected", "local-model", calls)
    assert (o.input_tokens, o.output_tokens, o.cached_tokens) == (70 * calls, 7 * calls, 20 * calls)


class _MarkerSeen(SpanProcessor):
    """Records, for each span started, whether its parent context says "already counted"."""

    def __init__(self) -> None:
        self.seen: dict[str, list[bool]] = {}

    def on_start(self, span, parent_context=None) -> None:
        marked = otel_context.get_value(COUNTED_KEY, parent_context) is True
        scope = span.instrumentation_scope.name if span.instrumentation_scope else ""
        self.seen.setdefault(f"{scope}:{span.name.split(' ')[0]}", []).append(marked)


@pytest.mark.parametrize("mode", MODES, ids="+".join)
def test_the_frameworks_own_spans_start_marked_as_counted(sink, llm, mode) -> None:
    guard.instrument(*mode)
    llm.script = finishing(2, input=50, output=5)
    seen = _MarkerSeen()
    sink.provider.add_span_processor(seen)
    caps = [Instrumentation(settings=InstrumentationSettings(tracer_provider=sink.provider))]
    assert agent_on(llm, capabilities=caps).run_sync("refund?").output == "done"
    # Its chat and execute_tool spans are of calls the integration counted: a span processor
    # or the guard reading the marker does not count them again.
    assert seen.seen["pydantic-ai:chat"] == [True] * 3
    assert seen.seen["pydantic-ai:execute_tool"] == [True] * 2
    assert seen.seen["pydantic-ai:invoke_agent"] == [False]  # the agent run: not a call
