"""The OpenAI Agents SDK integration in application shapes, with the real ``agents`` library
against the scripted server and a real guard: an agent calling a sub-agent as a tool under an
input guardrail that runs its own agent (nested ``Runner.run`` in one guard run), and streamed
runs the guard stops, read with ``async for ev in result.stream_events()``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from _llm_server import LLMServer, Reply, text, tool
from _wait import wait_until

import guard

agents = pytest.importorskip("agents")
from agents import (  # noqa: E402
    Agent,
    GuardrailFunctionOutput,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    input_guardrail,
    set_tracing_disabled,
)
from agents.result import RunResultStreaming  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402


@pytest.fixture(autouse=True)
def _local_tracing() -> Iterator[None]:
    set_tracing_disabled(True)  # the library's own tracing exports to OpenAI: keep it off here
    yield
    set_tracing_disabled(False)


def _model(llm: LLMServer, api: str = "chat") -> Any:
    client = AsyncOpenAI(base_url=llm.base_url, api_key="test", max_retries=0)
    cls = OpenAIChatCompletionsModel if api == "chat" else OpenAIResponsesModel
    return cls(model="gpt-4.1", openai_client=client)


def _record(store: Any, run_id: str) -> Any:
    assert store.wait_for(lambda s: s.run(run_id) is not None), "no termination record"
    return store.run(run_id)


# -- nested framework runs in one guard run ------------------------------------------------------
TRIAGE = "You triage refund questions."
SPECIALIST = "You are the refund specialist."
SCREEN = "Say 'safe' or 'unsafe' for the user's message."


def _system(body: dict[str, Any]) -> str:
    first = (body.get("messages") or [{}])[0]
    return str(first.get("content") or "") if first.get("role") == "system" else ""


def _tool_results(body: dict[str, Any]) -> int:
    return sum(1 for m in body.get("messages") or () if m.get("role") == "tool")


def _app_script(body: dict[str, Any], api: str) -> Reply:
    """The triage agent asks for a lookup and the specialist at once, then the specialist
    again, then answers; the specialist looks up once and answers; the screen says safe."""
    system, results = _system(body), _tool_results(body)
    if system.startswith(SCREEN):
        return text("safe")
    if system.startswith(SPECIALIST):
        return tool("lookup", {"q": "refund window"}) if results == 0 else text("30 days")
    if results == 0:
        both = (
            tool("lookup", {"q": "policy"}).tool_calls
            + tool("refund_specialist", {"input": "how long is the refund window?"}).tool_calls
        )
        return Reply(tool_calls=both)
    if results == 2:
        return tool("refund_specialist", {"input": "and for sale items?"})
    return text("Refunds within 30 days.")


def test_nested_runs_of_sub_agents_and_guardrails_keep_one_step_per_model_turn(llm, server):
    """``agent.as_tool()`` and a guardrail that runs an agent are framework runs nested in the
    outer one, attached to the same guard run: their end must not close the outer's step."""
    _, store = server
    guard.instrument()
    llm.script = _app_script

    @function_tool
    def lookup(q: str) -> str:
        """Look the policy up."""
        return f"the policy on {q}: 30 days"

    screen = Agent(name="screen", instructions=SCREEN, model=_model(llm))

    @input_guardrail
    async def safe_input(ctx: Any, agent: Any, user_input: Any) -> GuardrailFunctionOutput:
        verdict = await Runner.run(screen, user_input, context=ctx.context)
        out = str(verdict.final_output)
        return GuardrailFunctionOutput(output_info=out, tripwire_triggered="unsafe" in out)

    specialist = Agent(
        name="specialist", instructions=SPECIALIST, tools=[lookup], model=_model(llm)
    )
    triage = Agent(
        name="triage",
        instructions=TRIAGE,
        tools=[
            lookup,
            specialist.as_tool(
                tool_name="refund_specialist", tool_description="Ask the refund specialist."
            ),
        ],
        input_guardrails=[safe_input],
        model=_model(llm),
    )
    run_ids: list[str] = []

    @guard.run(agent="refund-desk", max_steps=50)
    async def desk() -> Any:
        run_ids.append(guard.current_run().run_id)
        return await Runner.run(triage, "how long do I have to return a jacket?")

    result = asyncio.run(desk())
    assert result.final_output == "Refunds within 30 days."
    # triage 3 turns, the specialist 2 turns twice, the screen 1
    assert llm.count == 8
    rec = _record(store, run_ids[0])
    assert rec.reason == "final_answer"
    assert rec.model_calls == llm.count
    assert rec.steps == llm.count  # one step per model turn, whichever run made it


# -- streamed runs the guard stops -----------------------------------------------------------------
class _Stream:
    """One streamed run the guard stops: ``loop`` (the same tool call and result every turn,
    decided in-process) or ``cancel`` (an operator's cancel through the guard while the second
    model call is in flight), ``attached`` to a ``@guard.run`` or a new run of its own."""

    def __init__(self, llm: LLMServer, address: str, how: str, attached: bool) -> None:
        self.llm, self.address, self.how, self.attached = llm, address, how, attached
        self.runs: list[Any] = []
        self.gates: list[Any] = []
        self.at_cancel: list[int] = []
        self.seen: list[BaseException] = []  # what came out of the user's async for
        self.after: list[int] = []  # model calls a moment after the stop came out

        @function_tool
        def lookup(q: str) -> str:
            """Look the policy up."""
            if not self.runs:
                self.runs.append(guard.current_run())
            if self.how == "cancel" and not self.gates:
                self.gates.append(llm.hold())  # the next model call is held
            return "refunds within 30 days"

        self.agent = Agent(
            name="streamer", instructions="Answer.", tools=[lookup], model=_model(llm, "responses")
        )

    def operator(self) -> None:
        from guard.cli._client import AdminClient

        wait_until(lambda: self.gates, 10, "the held model call")
        assert self.gates[0].arrived.wait(10)
        AdminClient(self.address).cancel(run_id=self.runs[0].run_id, reason="incident")
        try:  # the cancel reached the agent over its stream
            wait_until(lambda: self.runs[0].cancelled, 10, "the cancel to reach the run")
        finally:
            self.at_cancel.append(self.llm.count)
            self.gates[0].release()

    async def consume(self) -> None:
        result = Runner.run_streamed(self.agent, "what is the refund policy?", max_turns=60)
        try:
            async for _ in result.stream_events():
                pass
        except BaseException as exc:
            self.seen.append(exc)
            raise

    def drive(self) -> BaseException | None:
        """Run it once; what came out to the caller (``None`` if nothing)."""

        @guard.run(agent="stream-desk", max_steps=60)
        async def attached() -> None:
            self.runs.append(guard.current_run())
            await self.consume()

        async def main() -> None:
            try:
                await (attached() if self.attached else self.consume())
            finally:
                await asyncio.sleep(0.1)  # nothing more leaves once the stop came out
                self.after.append(self.llm.count)

        t = threading.Thread(target=self.operator, daemon=True) if self.how == "cancel" else None
        if t is not None:
            t.start()
        try:
            asyncio.run(main())
        except BaseException as exc:
            return exc
        finally:
            if t is not None:
                t.join(10)
        return None


CASES = [(how, attached) for how in ("loop", "cancel") for attached in (True, False)]
REASONS = {"loop": "loop_detected", "cancel": "operator_cancel"}


def test_a_streamed_run_the_guard_stops_raises_run_stopped_from_stream_events(llm, server):
    """Every time, whatever stopped it: the consumer's ``async for`` raises ``RunStopped`` with
    the run's reason (not the ``CancelledError`` of the guard's own task cancel), and no model
    call reaches the server after the stop."""
    srv, store = server
    guard.instrument()
    llm.script = lambda body, api: tool("lookup", {"q": "refund policy"})
    outcomes = []
    for i in range(12):
        how, attached = CASES[i % len(CASES)]
        llm.requests.clear()
        s = _Stream(llm, srv.address, how, attached)
        out = s.drive()
        case = f"run {i} ({how}, {'attached' if attached else 'new run'})"
        assert len(s.seen) == 1, case
        seen = s.seen[0]
        assert isinstance(seen, guard.RunStopped), f"{case}: {type(seen).__name__}"
        assert seen.outcome.reason == REASONS[how], case
        assert isinstance(out, guard.RunStopped) and out.outcome.reason == REASONS[how], case
        rec = _record(store, s.runs[0].run_id)
        assert rec.reason == REASONS[how], case
        assert s.after == [llm.count], case
        if how == "loop":  # decided at a tool result: every call that left was counted
            assert rec.model_calls == llm.count, case
        else:  # the held call was in flight at the cancel: it is the last one that left
            assert s.at_cancel == [llm.count] == [2], case
            # (counted when the cancel cut its stream, not when it cut the wait for it)
            assert rec.model_calls in (1, 2), case
        outcomes.append(seen.outcome.reason)
    assert outcomes == [REASONS[CASES[i % len(CASES)][0]] for i in range(12)]


@pytest.mark.parametrize("attached", [True, False], ids=["attached", "new-run"])
def test_the_users_own_cancel_of_a_streamed_run_stays_a_cancelled_error(llm, server, attached):
    guard.instrument()
    gates: list[Any] = []
    llm.script = lambda body, api: tool("lookup", {"q": str(len(llm.requests))})

    @function_tool
    def lookup(q: str) -> str:
        """Look the policy up."""
        if not gates:
            gates.append(llm.hold())
        return f"page {q}"

    agent = Agent(name="reader", instructions="Answer.", tools=[lookup], model=_model(llm))
    seen: list[BaseException] = []

    async def consume() -> None:
        result = Runner.run_streamed(agent, "hi", max_turns=60)
        try:
            async for _ in result.stream_events():
                pass
        except BaseException as exc:
            seen.append(exc)
            raise

    async def main() -> None:
        body = guard.run(agent="reader-desk", max_steps=60)(consume) if attached else consume
        task = asyncio.ensure_future(body())
        while not (gates and gates[0].arrived.is_set()):
            await asyncio.sleep(0.01)
        task.cancel()  # the user's own cancel, while the second call is in flight
        try:
            await task
        finally:
            gates[0].release()

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())
    assert len(seen) == 1 and type(seen[0]) is asyncio.CancelledError


def test_uninstrument_restores_the_streamed_results_stream_events():
    before = RunResultStreaming.stream_events
    guard.instrument("openai_agents")
    assert RunResultStreaming.stream_events is not before
    guard.uninstrument()
    assert RunResultStreaming.stream_events is before
