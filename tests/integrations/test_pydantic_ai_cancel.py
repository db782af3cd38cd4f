"""A real guard's cancel stops a Pydantic AI run for real: ``RunStopped`` out of ``run_sync``
inside a sync ``@guard.run``, out of ``agent.run`` / ``run_stream`` inside and outside an async
``@guard.run``, at most one
model call after the cancel (the one in flight), and a tool's result reached after the cancel
never becomes a request the model reads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from _llm_server import tool
from _pydantic_ai_help import MODES, agent_on
from _wait import wait_until

import guard
from guard.cli._client import AdminClient
from guard.server import MemorySink, ServerThread
from guard.testing import capture_spans


@pytest.fixture
def srv() -> Iterator[ServerThread]:
    with (
        ServerThread(sink=MemorySink()) as server,
        capture_spans(endpoint=server.address, hmac_key=b"test-key-0123456789"),
    ):
        yield server


def _cancel(srv: ServerThread, agent: str) -> list[str]:
    with AdminClient(srv.address) as client:  # registered once admitted
        wait_until(lambda: client.list_runs(agent=agent).runs, 10, "the run to reach the guard")
        return client.cancel(agent=agent, reason="incident")


def _sync_guard_run(name: str, agent) -> tuple[threading.Thread, dict]:
    """``agent.run_sync`` inside a sync ``@guard.run`` on a thread; ``box``: run, exc."""
    box: dict = {}

    @guard.run(agent=name)
    def handle() -> None:
        box["run"] = guard.current_run()
        agent.run_sync("refund?")

    def body() -> None:
        try:
            handle()
        except BaseException as exc:
            box["exc"] = exc

    th = threading.Thread(target=body)
    th.start()
    return th, box


def _fresh(llm) -> None:
    llm.script = lambda body, api: tool("status", {"q": f"order {llm.count}"}, input=50, output=5)


def _status_tool(agent) -> None:
    @agent.tool_plain
    def status(q: str) -> str:
        return f"{q}: pending"


@pytest.mark.parametrize("mode", MODES, ids="+".join)
def test_guard_cancel_stops_run_sync_inside_a_sync_guard_run(srv, llm, mode) -> None:
    guard.instrument(*mode)
    _fresh(llm)
    agent = agent_on(llm)
    _status_tool(agent)
    gate = llm.hold()  # the first request waits until the cancel has reached the run
    th, box = _sync_guard_run("sync-bot", agent)
    assert gate.arrived.wait(10)
    assert _cancel(srv, "sync-bot")
    at_cancel = llm.count
    wait_until(
        lambda: "run" in box and box["run"].cancelled, 10, "the cancel never reached the run"
    )
    # The framework's run is stopped for real: the request in flight is closed, unanswered.
    wait_until(gate.disconnected.is_set, 10, "the request in flight was not closed")
    gate.release()
    th.join(10)
    exc = box.get("exc")
    assert isinstance(exc, guard.RunStopped), exc
    assert (exc.outcome.reason, exc.outcome.decided_by) == ("operator_cancel", "operator")
    # The goal is at most one (the call in flight); that one arrived before the cancel, and
    # none left after it: the in-flight request was abandoned, not answered and continued.
    assert llm.count - at_cancel == 0


@pytest.mark.parametrize("inside", [False, True], ids=["own-run", "in-guard-run"])
@pytest.mark.parametrize("entry", ["run", "run_stream"])
async def test_guard_cancel_stops_an_async_run(srv, llm, entry, inside) -> None:
    guard.instrument("pydantic_ai")  # the framework layer alone (the sync test covers both)
    _fresh(llm)
    agent = agent_on(llm, name="async-bot")
    _status_tool(agent)
    gate = llm.hold(after_events=1)  # a stream is held after its first event

    async def drive() -> None:
        if entry == "run":
            await agent.run("refund?")
        else:
            async with agent.run_stream("refund?") as res:
                await res.get_output()

    if inside:  # attached: the guarded run's cancel cancels this very task
        drive = guard.run(agent="async-bot")(drive)
    task = asyncio.ensure_future(drive())
    assert await asyncio.to_thread(gate.arrived.wait, 10)
    assert await asyncio.to_thread(_cancel, srv, "async-bot")
    at_cancel = llm.count
    with pytest.raises(guard.RunStopped) as stop:
        await asyncio.wait_for(task, 10)
    gate.release()
    o = stop.value.outcome
    assert (o.reason, o.agent) == ("operator_cancel", "async-bot")
    assert llm.count - at_cancel == 0  # the held call was in flight; nothing left after


def test_a_tool_result_reached_after_the_cancel_never_reaches_the_model(srv, llm) -> None:
    guard.instrument("pydantic_ai")  # the model layer of the framework alone: no openai layer
    llm.script = lambda body, api: tool("slow", {"q": f"order {llm.count}"}, input=50, output=5)
    agent = agent_on(llm, name="tool-bot")
    started, release = threading.Event(), threading.Event()

    @agent.tool_plain
    def slow(q: str) -> str:
        started.set()
        release.wait(10)
        return "refund issued"

    th, box = _sync_guard_run("tool-bot", agent)
    assert started.wait(10)
    assert _cancel(srv, "tool-bot")
    at_cancel = llm.count
    wait_until(lambda: box["run"].cancelled, 10, "the cancel never reached the run")
    release.set()
    th.join(10)
    assert isinstance(box.get("exc"), guard.RunStopped), box.get("exc")
    assert llm.count == at_cancel  # the tool's result was never sent to the model
    assert box["exc"].outcome.reason == "operator_cancel"
