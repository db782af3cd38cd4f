"""The OpenAI Agents SDK integration with the real ``agents`` library against the scripted
OpenAI-compatible server: ``Runner.run``, ``Runner.run_sync`` and ``Runner.run_streamed``, the
chat completions and the responses models, inside and outside a ``@guard.run``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from _llm_server import LLMServer, text, tool
from _wait import wait_until

import guard
from guard.integrations._base import errors

agents = pytest.importorskip("agents")
from agents import (  # noqa: E402
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI  # noqa: E402

from guard.server import MemorySink, ServerThread  # noqa: E402

MODES = ["run", "run_sync", "run_streamed"]


@pytest.fixture(autouse=True)
def _local_tracing() -> Iterator[None]:
    set_tracing_disabled(True)  # the library's own tracing exports to OpenAI: keep it off here
    yield
    set_tracing_disabled(False)


class Lookup:
    """A real function tool: counts its calls; the same answer every time by default."""

    def __init__(self, answer: Any = None, on_call: Any = None) -> None:
        self.calls: list[str] = []
        self._answer, self._on_call = answer, on_call

        @function_tool
        def lookup(q: str) -> str:
            """Look the policy up."""
            self.calls.append(q)
            if self._on_call is not None:
                self._on_call(len(self.calls))
            return "refunds within 30 days" if self._answer is None else self._answer(q)

        self.tool = lookup


def _agent(llm: LLMServer, api: str, lookup: Lookup, name: str = "researcher") -> Agent:
    client = AsyncOpenAI(base_url=llm.base_url, api_key="test", max_retries=0)
    cls = OpenAIChatCompletionsModel if api == "chat" else OpenAIResponsesModel
    model = cls(model="gpt-4.1", openai_client=client)
    return Agent(name=name, instructions="Answer the question.", tools=[lookup.tool], model=model)


def _drive(mode: str, agent: Agent, max_turns: int = 60) -> Any:
    """One framework run through the given entry point (from sync code)."""
    if mode == "run_sync":
        return Runner.run_sync(agent, "what is the refund policy?", max_turns=max_turns)

    async def main() -> Any:
        if mode == "run":
            return await Runner.run(agent, "what is the refund policy?", max_turns=max_turns)
        result = Runner.run_streamed(agent, "what is the refund policy?", max_turns=max_turns)
        async for _ in result.stream_events():
            pass
        return result

    return asyncio.run(main())


def _varying(llm: LLMServer, **usage: int) -> Any:
    """The runaway: a tool call with new arguments every turn (and the same result)."""
    return lambda body, api: tool("lookup", {"q": f"refund policy #{len(llm.requests)}"}, **usage)


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("mode", MODES)
def test_a_runaway_loop_is_stopped_as_loop_detected_inside_a_guard_run(sink, llm, mode, api):
    guard.instrument()
    llm.script = _varying(llm)
    lookup = Lookup()
    agent = _agent(llm, api, lookup)

    @guard.run(agent="support", max_steps=50)
    def support() -> Any:
        return _drive(mode, agent)

    with pytest.raises(guard.RunStopped) as stop:
        support()
    o = stop.value.outcome
    assert o.reason == "loop_detected" and o.agent == "support"  # attached to the active run
    # Every call that left was counted once; the stop left no call behind it, and the tools
    # that ran are the ones recorded (one model turn plus its tool = one inferred step): the
    # loop is seen at the last tool result, and the next model call is refused.
    assert o.model_calls == llm.count < 10
    assert o.tool_calls == len(lookup.calls) == o.model_calls
    assert o.steps == o.model_calls


@pytest.mark.parametrize("mode", MODES)
def test_outside_a_guard_run_each_framework_run_is_its_own_run_named_after_the_agent(
    sink, llm, mode
):
    guard.instrument("openai_agents")
    llm.script = _varying(llm)
    with pytest.raises(guard.RunStopped) as stop:
        _drive(mode, _agent(llm, "responses", Lookup(), name="refund-researcher"))
    o = stop.value.outcome
    assert (o.agent, o.reason, o.model_calls) == ("refund-researcher", "loop_detected", llm.count)
    # A run that ends normally is a completed run of its own as well.
    llm.script = [text("refunds within 30 days", input=40, output=8)]
    llm.requests.clear()
    result = _drive(mode, _agent(llm, "responses", Lookup(), name="answerer"))
    assert result.final_output == "refunds within 30 days"
    ends = sink.attributes("invoke_agent answerer")
    assert len(ends) == 1 and ends[0]["guard.stop.reason"] == "final_answer"


@pytest.mark.parametrize("mode", MODES)
def test_a_token_budget_stops_the_run_with_its_exact_tokens(sink, llm, mode):
    guard.instrument()
    llm.script = lambda body, api: tool(
        "lookup", {"q": str(len(llm.requests))}, input=300, output=50, cached=100, reasoning=20
    )
    lookup = Lookup(answer=lambda q: f"page {q}")  # new facts each time: no loop

    @guard.run(agent="budgeted", max_tokens=1000, max_steps=50)
    def budgeted() -> Any:
        return _drive(mode, _agent(llm, "chat", lookup))

    with pytest.raises(guard.RunStopped) as stop:
        budgeted()
    o = stop.value.outcome
    assert o.reason == "token_budget" and o.model_calls == llm.count == 3
    assert (o.input_tokens, o.output_tokens) == (900, 150)
    assert (o.cached_tokens, o.reasoning_tokens) == (300, 60)
    # The third call's tool was refused by the stop the call reached: the tools that ran are
    # the tool calls recorded.
    assert o.tool_calls == len(lookup.calls) == 2


@pytest.mark.parametrize("names", [(), ("openai_agents",)], ids=["all", "agents-only"])
def test_each_model_call_is_counted_once_whichever_integrations_are_on(sink, llm, names):
    on = guard.instrument(*names)
    assert "openai_agents" in on
    llm.script = [tool("lookup", {"q": "a"}, input=25, output=5), text("done", input=35, output=7)]

    @guard.run(agent="once")
    def once() -> Any:
        return Runner.run_sync(_agent(llm, "responses", Lookup()), "hi")

    assert once().final_output == "done"
    [end] = sink.attributes("invoke_agent once")
    assert (end["guard.stop.reason"], llm.count) == ("final_answer", 2)
    calls = sink.attributes("responses gpt-4.1")
    assert [(a["gen_ai.usage.input_tokens"], a["gen_ai.response.id"][:5]) for a in calls] == [
        (25, "resp-"),
        (35, "resp-"),
    ]
    # Turned on as this integration's dependency, the client layer goes off with it.
    from openai.resources.responses import responses

    guard.uninstrument()
    assert not hasattr(responses.AsyncResponses.__dict__["create"], "__guard_original__")


def test_a_refusal_inside_a_tool_ends_the_run_instead_of_becoming_a_tool_result(sink, llm):
    """The measured defect: inside a sync ``@guard.run`` a cancel made ``@guard.tool`` refuse,
    the library turned each refusal into a tool result, and the run went on for 56 calls."""
    guard.instrument()
    llm.script = _varying(llm)

    @guard.tool
    def fetch(q: str) -> str:
        return "refunds within 30 days"

    def on_call(n: int) -> None:
        if n == 2:
            guard.current_run().cancel("user_cancel")
        fetch(q=str(n))  # refused after the cancel: RunStopped inside the tool

    lookup = Lookup(on_call=on_call)

    @guard.run(agent="refused", max_steps=100)
    def refused() -> Any:
        return Runner.run_sync(_agent(llm, "chat", lookup), "hi", max_turns=60)

    with pytest.raises(guard.RunStopped) as stop:
        refused()
    o = stop.value.outcome
    assert o.reason == "user_cancel" and o.model_calls == llm.count == 2
    assert o.tool_calls == 1  # counted once: the @guard.tool inside recorded it, not twice


# A streamed run on the responses model reads its stream through the client's
# ``with_streaming_response`` (a raw response whose parse() gives the stream): guarded too.
RECORDED = [
    ("run", "responses"),
    ("run_sync", "responses"),
    ("run_streamed", "chat"),
    ("run_streamed", "responses"),
]


@pytest.mark.parametrize(("mode", "api"), RECORDED)
def test_a_real_guard_cancel_leaves_at_most_the_call_in_flight_and_the_record_is_exact(
    llm, mode, api
):
    from guard.cli._client import AdminClient

    guard.instrument()
    llm.script = lambda body, api: tool(
        "lookup", {"q": str(len(llm.requests))}, input=70, output=30, cached=10, reasoning=4
    )
    gates: list[Any] = []
    # The second request is held (asked for while the first turn's tool runs): the operator's
    # cancel lands while it is in flight.
    lookup = Lookup(answer=lambda q: f"page {q}", on_call=lambda n: gates.append(llm.hold()))
    store = MemorySink()
    with ServerThread(sink=store) as srv:
        guard.configure(endpoint=srv.address, admit_timeout_ms=3000)
        runs: list[Any] = []
        at_cancel: list[int] = []

        def operator() -> None:
            wait_until(lambda: gates, 10, "the held model call")
            assert gates[0].arrived.wait(10)
            AdminClient(srv.address).cancel(run_id=runs[0].run_id, reason="incident")
            try:  # the cancel reached the agent over its stream
                wait_until(lambda: runs[0].cancelled, 10, "the cancel to reach the run")
            finally:
                at_cancel.append(llm.count)
                gates[0].release()

        @guard.run(agent="guarded", max_steps=200)
        def guarded() -> Any:
            runs.append(guard.current_run())
            return _drive(mode, _agent(llm, api, lookup))

        t = threading.Thread(target=operator, daemon=True)
        t.start()
        with pytest.raises(guard.RunStopped) as stop:
            guarded()
        t.join(10)
        o = stop.value.outcome
        assert o.reason == "operator_cancel" and llm.count - at_cancel[0] <= 1
        assert lookup.calls == ["1"]  # the held call asked for a tool: refused, never run
        assert store.wait_for(lambda s: s.run(o.run_id) is not None)
        rec = store.run(o.run_id)
        assert rec.model_calls == o.model_calls == llm.count == 2
        assert rec.tool_calls == o.tool_calls == 1
        # A stream cut by the cancel never delivered its usage: only whole calls have tokens.
        whole = 1 if mode == "run_streamed" else 2
        assert (rec.input_tokens, rec.output_tokens) == (70 * whole, 30 * whole)
        assert (rec.cached_tokens, rec.reasoning_tokens) == (10 * whole, 4 * whole)
        assert (o.input_tokens, o.output_tokens) == (rec.input_tokens, rec.output_tokens)
        guard.shutdown()


def test_an_async_run_cancelled_mid_call_makes_no_further_model_call(sink, llm):
    guard.instrument()
    llm.script = _varying(llm)
    gates: list[Any] = []
    lookup = Lookup(on_call=lambda n: gates.append(llm.hold()))  # the second call is held
    runs: list[Any] = []

    @guard.run(agent="async-bot", max_steps=100)
    async def bot() -> Any:
        runs.append(guard.current_run())
        return await Runner.run(_agent(llm, "chat", lookup), "hi", max_turns=60)

    def cancel() -> None:
        wait_until(lambda: gates, 10, "the held model call")
        assert gates[0].arrived.wait(10)
        runs[0].cancel("user_cancel")  # the run's task is cancelled mid-call
        gates[0].release()

    t = threading.Thread(target=cancel, daemon=True)
    t.start()
    with pytest.raises(guard.RunStopped) as stop:
        asyncio.run(bot())
    t.join(10)
    o = stop.value.outcome
    assert o.reason == "user_cancel" and llm.count == 2 and lookup.calls == ["refund policy #1"]
    assert o.tool_calls == 1 and o.model_calls <= 2


def test_a_guard_side_failure_never_breaks_the_agent(sink, llm, monkeypatch):
    from guard.integrations import openai_agents

    guard.instrument()

    def broken(*a: Any, **kw: Any) -> Any:
        raise RuntimeError("guard bug")

    monkeypatch.setattr(openai_agents, "admit_tool", broken)
    llm.script = [tool("lookup", {"q": "a"}), text("done")]
    lookup = Lookup()

    @guard.run(agent="robust")
    def robust() -> Any:
        return Runner.run_sync(_agent(llm, "chat", lookup), "hi")

    assert robust().final_output == "done" and lookup.calls == ["a"]
    assert errors().get("admitting an openai-agents tool call", 0) >= 1


def test_the_example_runs_with_one_line_of_guard_code(llm):
    import os
    import subprocess
    import sys
    from pathlib import Path

    llm.script = [tool("lookup_policy", {"topic": "refunds"}), text("Yes, within 30 days.")]
    example = Path(__file__).resolve().parents[2] / "examples" / "openai_agents_agent.py"
    env = {
        **os.environ,
        "OPENAI_BASE_URL": llm.base_url,
        "OPENAI_API_KEY": "local",
        "OPENAI_AGENTS_DISABLE_TRACING": "1",
    }
    env.pop("OTEL_GUARD_ENDPOINT", None)
    out = subprocess.run(
        [sys.executable, str(example)], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Yes, within 30 days." and llm.count == 2
