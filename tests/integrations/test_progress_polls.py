"""Framework agents run with ``guard.instrument()`` alone (no progress reported by the code):
progress derived from the tool results, and declared polls, with the real Pydantic AI and
OpenAI Agents libraries on the scripted local server and a real guard.

* a search with new queries every turn whose results only cycle among ones already seen is
  stopped ``no_progress`` at the policy's ``no_progress_steps``;
* re-reading the same config each step while writing a new file each step is never stopped;
* a poll answering "pending" four times, then "done", completes; one stuck on "pending" is
  stopped at ``max_unchanged_polls`` (declared by ``instrument(polls=...)`` or by the policy).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from _llm_server import LLMServer, Reply, text, tool

import guard
from guard.policy import PolicyConfig
from guard.server import MemorySink, ServerThread
from guard.testing import capture_spans

pydantic_ai = pytest.importorskip("pydantic_ai")
agents = pytest.importorskip("agents")
import openai  # noqa: E402
from agents import Agent as OAAgent  # noqa: E402
from agents import OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled  # noqa: E402
from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.models.openai import OpenAIChatModel  # noqa: E402
from pydantic_ai.providers.openai import OpenAIProvider  # noqa: E402


@pytest.fixture(autouse=True)
def _local_tracing() -> Iterator[None]:
    set_tracing_disabled(True)  # the Agents SDK's own tracing exports to OpenAI: off here
    yield
    set_tracing_disabled(False)


@contextlib.contextmanager
def _guarded(policy: dict[str, Any] | None = None) -> Iterator[MemorySink]:
    """A real guard with ``policy``, the SDK exporting to it (each run waits for its admit,
    so the policy's limits apply from the first step); yields the guard's record store."""
    store = MemorySink()
    with ServerThread(PolicyConfig.from_dict(policy), sink=store) as srv:
        key = b"test-key-0123456789"
        with capture_spans(endpoint=srv.address, hmac_key=key, admit_timeout_ms=3000):
            yield store
            guard.shutdown()


def _record(store: MemorySink, run_id: str) -> Any:
    assert store.wait_for(lambda s: s.run(run_id) is not None)
    return store.run(run_id)


def _only_run(store: MemorySink) -> Any:
    guard.shutdown()  # waits for the record's acknowledgement
    assert store.wait_for(lambda s: len(s.runs) == 1)
    return store.runs[0]


def _pydantic_agent(llm: LLMServer) -> Agent:
    client = openai.AsyncOpenAI(base_url=llm.base_url, api_key="test", max_retries=0)
    model = OpenAIChatModel("gpt-4.1", provider=OpenAIProvider(openai_client=client))
    return Agent(model, name="worker")


def _agents_model(llm: LLMServer) -> Any:
    client = openai.AsyncOpenAI(base_url=llm.base_url, api_key="test", max_retries=0)
    return OpenAIChatCompletionsModel(model="gpt-4.1", openai_client=client)


# -- progress derived from the tool results ---------------------------------------------------
def test_a_search_that_only_finds_what_it_saw_is_stopped_as_no_progress(llm) -> None:
    guard.instrument()
    queries = itertools.count(1)
    llm.script = lambda body, api: tool("search", {"q": f"refund rules, take {next(queries)}"})
    agent = _pydantic_agent(llm)
    seen = ["no match", "see the FAQ", "ask support"]

    @agent.tool_plain
    def search(q: str) -> str:
        return seen[int(q.rsplit(" ", 1)[1]) % 3]  # new queries, the same three answers

    with _guarded({"runs": {"loop": {"no_progress_steps": 4}}}) as store:
        with pytest.raises(guard.RunStopped) as stop:
            agent.run_sync("what are the refund rules?")
        o = stop.value.outcome
        assert _record(store, o.run_id).reason == "no_progress"
    # Three steps found something new, then four in a row found nothing: the next model call
    # is refused (before this, the run went on until the framework's own limit).
    assert (o.reason, o.status, o.decided_by) == ("no_progress", "terminated", "sdk"), o.message
    assert o.steps == o.model_calls == o.tool_calls == llm.count == 3 + 4
    assert "no_progress_steps=4" in o.message


def test_facts_the_agent_reports_from_a_tool_win_over_the_derived_progress(llm) -> None:
    """New snippets every turn, but the task state the agent reports never changes: with
    ``guard.progress(facts=...)`` in the tool (the step is one the integration inferred), the
    frozen facts are what the stagnation rule judges, not the new results."""
    guard.instrument()
    queries = itertools.count(1)
    llm.script = lambda body, api: tool("search", {"q": f"angle {next(queries)}"})
    agent = _pydantic_agent(llm)

    @agent.tool_plain
    def search(q: str) -> str:
        guard.progress(facts=["bug is in payment.py"])  # what the agent knows: unchanged
        return f"snippet for {q}"  # new every time: derived progress alone would say True

    with _guarded({"runs": {"loop": {"no_progress_steps": 4}}}) as store:
        with pytest.raises(guard.RunStopped) as stop:
            agent.run_sync("find the bug")
        o = stop.value.outcome
        assert _record(store, o.run_id).reason == "no_progress"
    # the first state is the baseline; four unchanged ones after it stop the run
    assert (o.reason, o.decided_by) == ("no_progress", "sdk"), o.message
    assert o.steps == o.tool_calls == 1 + 4


def test_a_config_reread_beside_a_new_file_each_step_is_never_stopped(llm) -> None:
    guard.instrument()
    turns = [
        Reply(
            tool_calls=(
                ("read_config", {"path": "app.yaml"}, f"read_{i}"),
                ("write_file", {"path": f"out/{i}.txt"}, f"write_{i}"),
            )
        )
        for i in range(12)
    ]
    llm.script = [*turns, text("all twelve files written")]
    agent = _pydantic_agent(llm)
    written: list[str] = []

    @agent.tool_plain
    def read_config(path: str) -> str:
        return "format: csv\ndebug: false"

    @agent.tool_plain
    def write_file(path: str) -> str:
        written.append(path)
        return f"wrote {path}"

    with _guarded() as store:
        out = agent.run_sync("write the twelve reports")
        rec = _only_run(store)  # neither the SDK nor the guard stopped it
    assert out.output == "all twelve files written"
    assert len(written) == 12 and llm.count == 13
    assert (rec.reason, rec.steps, rec.tool_calls) == ("final_answer", 13, 24)


# -- polls ------------------------------------------------------------------------------------
def _poller(llm: LLMServer, answers: Iterator[str]) -> OAAgent:
    @function_tool
    def job_status(job_id: str) -> str:
        """The status of a job."""
        return next(answers)

    return OAAgent(
        name="waiter",
        instructions="Wait for the job.",
        tools=[job_status],
        model=_agents_model(llm),
    )


def _poll_turns(llm: LLMServer) -> Any:
    """The model polls job j1 until the last tool result says done, then answers."""

    def reply(body: dict, api: str) -> Reply:
        last = body["messages"][-1]
        if last.get("role") == "tool" and "done" in str(last.get("content")):
            return text("the job is done")
        return tool("job_status", {"job_id": "j1"})

    return reply


def test_a_declared_poll_completes_and_a_stuck_one_stops_at_max_unchanged_polls(llm) -> None:
    guard.instrument(polls=["job_status"])
    llm.script = _poll_turns(llm)
    answers = iter(["pending"] * 4 + ["done"])
    with _guarded() as store:
        result = Runner.run_sync(_poller(llm, answers), "wait for j1", max_turns=60)
        rec = _only_run(store)  # the guard counted the polls and did not stop the run either
    assert result.final_output == "the job is done"
    assert (rec.reason, rec.tool_calls, rec.model_calls) == ("final_answer", 5, 6)

    llm.requests.clear()
    with _guarded(), pytest.raises(guard.RunStopped) as stop:
        Runner.run_sync(_poller(llm, itertools.repeat("pending")), "wait for j1", max_turns=60)
    o = stop.value.outcome
    assert (o.reason, o.decided_by) == ("loop_detected", "sdk")
    assert "poll_unchanged" in o.message and "max_unchanged_polls=10" in o.message
    assert o.tool_calls == o.model_calls == llm.count == 10


def test_the_guards_policy_declares_the_poll_and_its_bound(llm) -> None:
    guard.instrument()
    llm.script = _poll_turns(llm)
    policy = {"runs": {"loop": {"poll_tools": ["job_status"], "max_unchanged_polls": 5}}}
    with _guarded(policy) as store:
        with pytest.raises(guard.RunStopped) as stop:
            poller = _poller(llm, itertools.repeat("pending"))
            Runner.run_sync(poller, "wait for j1", max_turns=60)
        o = stop.value.outcome
        assert _record(store, o.run_id).reason == "loop_detected"
    assert o.reason == "loop_detected" and "max_unchanged_polls=5" in o.message
    assert o.tool_calls == llm.count == 5
