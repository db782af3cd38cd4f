"""Progress derived from tool results for steps whose code reports none, and declared polls
(``@guard.tool(poll=True)``, ``step.tool_call(poll=True)``, ``guard.instrument(polls=...)``,
the policy's ``loop.poll_tools``): in-process, on the spans and through a real guard."""

from __future__ import annotations

from typing import Any

import pytest

import guard
from guard.errors import ConfigError
from guard.policy import Limits, LoopSettings, PolicyConfig
from guard.server import MemorySink, ServerThread
from guard.testing import SpanSink, capture_spans
from guard.wire import limits_from_pb, limits_to_pb

FP_ATTR, POLL_ATTR, PROGRESS = "guard.action.fingerprint", "guard.tool.poll", "guard.progress"


def _steps(sink: SpanSink, run_id: str) -> list[dict[str, Any]]:
    return [a for a in sink.attributes("guard.step") if a.get("guard.run.id") == run_id]


def _tools(sink: SpanSink, name: str) -> list[dict[str, Any]]:
    return sink.attributes(f"execute_tool {name}")


# -- polls ------------------------------------------------------------------------------------
def test_a_declared_poll_pending_four_times_then_done_completes(sink: SpanSink) -> None:
    answers = iter(["pending"] * 4 + ["done"])

    @guard.tool(poll=True)
    def job_status(job: str) -> str:
        return next(answers)

    @guard.run(agent="poller")
    def agent() -> str:
        status = ""
        while status != "done":
            with guard.step():
                status = job_status("j1")
        return status

    assert agent() == "done"
    spans = _tools(sink, "job_status")
    assert len(spans) == 5
    for a in spans:  # counted by the guard, never fed to its loop detector
        assert FP_ATTR not in a and a[POLL_ATTR] is True and a["guard.result.hash"]
    # Steps that only polled are neither progress nor stale: no progress flag, no fingerprint.
    (run,) = sink.attributes("invoke_agent poller")
    for a in _steps(sink, run["guard.run.id"]):
        assert PROGRESS not in a and FP_ATTR not in a

    # The same calls undeclared: the third unchanged answer is an exact repeat.
    answers = iter(["pending"] * 4 + ["done"])
    plain = guard.tool(name="job_status")(lambda job: next(answers))

    @guard.run(agent="poller")
    def undeclared() -> None:
        for _ in range(5):
            with guard.step():
                plain("j1")

    with pytest.raises(guard.RunStopped) as stop:
        undeclared()
    assert (stop.value.outcome.reason, stop.value.outcome.tool_calls) == ("loop_detected", 3)


def test_a_poll_stuck_on_one_answer_is_stopped_at_max_unchanged_polls(sink: SpanSink) -> None:
    directives: list[tuple[str, str, str]] = []

    @guard.tool(poll=True)
    def job_status(job: str) -> str:
        return "pending"

    @guard.run(agent="poller")
    def agent() -> None:
        guard.current_run().on_directive(lambda *d: directives.append(d))
        for _ in range(30):
            with guard.step():
                job_status("j1")

    with pytest.raises(guard.RunStopped) as stop:
        agent()
    o = stop.value.outcome
    assert (o.status, o.reason, o.tool_calls, o.decided_by) == (
        "terminated",
        "loop_detected",
        10,
        "sdk",
    )
    assert "poll_unchanged" in o.message and "max_unchanged_polls=10" in o.message
    assert o.loop_hits == 2  # the warning one short, then the stop
    assert [(a, r) for a, r, _ in directives] == [("warn", "loop_detected")]
    assert "9x in a row" in directives[0][2]


def test_a_poll_recorded_by_hand_and_a_poll_named_by_the_run_policy(sink: SpanSink) -> None:
    @guard.run(agent="hand", loop={"poll_tools": ["build_state"], "max_unchanged_polls": 4})
    def agent() -> None:
        for _ in range(3):
            with guard.step() as step:
                step.tool_call("job_status", {"id": 1}, result="pending", poll=True)
                step.tool_call("build_state", {"id": 1}, result="running")
        with guard.step() as step:
            step.tool_call("build_state", {"id": 1}, result="running")  # its fourth: the stop
        with guard.step():  # raised at the next step
            pass

    with pytest.raises(guard.RunStopped) as stop:
        agent()
    o = stop.value.outcome
    assert (o.reason, o.tool_calls, o.steps) == ("loop_detected", 7, 4)
    assert "max_unchanged_polls=4" in o.message
    assert all(POLL_ATTR in a and FP_ATTR not in a for a in _tools(sink, "build_state"))


def test_tools_named_by_instrument_are_polls_until_uninstrumented(sink: SpanSink) -> None:
    try:
        guard.instrument("openai", polls=["job_status"])

        @guard.run(agent="named")
        def agent() -> None:
            for _ in range(6):
                with guard.step() as step:
                    step.tool_call("job_status", {"id": 1}, result="pending")

        agent()  # six unchanged answers: below the default of ten
    finally:
        guard.uninstrument()
    assert all(a[POLL_ATTR] is True for a in _tools(sink, "job_status"))
    with pytest.raises(guard.RunStopped):
        agent()  # forgotten: the third unchanged answer is a repeat again
    with pytest.raises(ConfigError, match=r"instrument\.polls"):
        guard.instrument("openai", polls=[""])
    with pytest.raises(ConfigError, match=r"tool\.poll"):
        guard.tool(poll="yes")  # type: ignore[call-overload]


def test_a_step_that_only_polled_with_unchanged_facts_is_not_stale(sink: SpanSink) -> None:
    @guard.run(agent="waiter", loop={"no_progress_steps": 3})
    def agent() -> None:
        for i in range(8):
            with guard.step() as step:
                step.tool_call("job_status", {"id": 1}, result=f"{i * 10}%", poll=True)
                step.progress(facts=["waiting for job 1"])

    agent()
    (run,) = sink.attributes("invoke_agent waiter")
    steps = _steps(sink, run["guard.run.id"])
    # The unchanged state goes out once; after that the guard is not told of a stale step.
    assert ["guard.state.hash" in a for a in steps] == [True] + [False] * 7


# -- derived progress -------------------------------------------------------------------------
def test_steps_without_progress_get_it_from_their_tool_results_on_the_span(sink: SpanSink) -> None:
    @guard.run(agent="reader")
    def agent() -> None:
        for result in ["a", "a", "b"]:
            with guard.step() as step:
                step.tool_call("read", {"n": 1}, result=result)
        with guard.step() as step:
            step.model_call(model="gpt-4.1", input_tokens=10, output_tokens=1)
        with guard.step() as step:  # the code's own word wins
            step.tool_call("read", {"n": 2}, result="c")
            step.progress(False)
        with guard.step() as step:  # and so do its facts
            step.tool_call("read", {"n": 3}, result="a")
            step.progress(facts=["x"])
        with guard.step() as step:  # an error is a result too
            step.tool_call("read", {"n": 4}, error=TimeoutError())
        with guard.step() as step:
            step.tool_call("read", {"n": 5}, error=TimeoutError())

    agent()
    (run,) = sink.attributes("invoke_agent reader")
    got = [a.get(PROGRESS) for a in _steps(sink, run["guard.run.id"])]
    assert got == [True, False, True, None, False, None, True, False]


def test_searches_finding_only_seen_results_stop_as_no_progress(sink: SpanSink) -> None:
    @guard.tool
    def search(q: str) -> str:
        return ["no match", "see the FAQ", "ask support"][len(q) % 3]

    @guard.run(agent="searcher", loop={"no_progress_steps": 4})
    def agent() -> None:
        for i in range(36):
            with guard.step():
                search("x" * (i + 1))  # a new query every time

    with pytest.raises(guard.RunStopped) as stop:
        agent()
    o = stop.value.outcome
    assert (o.reason, o.steps) == ("no_progress", 3 + 4), o.message


def test_a_fan_out_over_fifteen_users_with_a_policy_reread_each_never_stops(sink: SpanSink) -> None:
    @guard.tool
    def refund_policy() -> str:
        return "refunds within 30 days"

    @guard.tool
    def get_user(uid: int) -> dict:
        return {"id": uid, "name": f"user {uid}"}

    @guard.run(agent="fan-out")
    def agent() -> int:
        for uid in range(15):
            with guard.step():
                refund_policy()
                get_user(uid)
        return uid

    assert agent() == 14


def test_a_config_reread_beside_a_new_file_each_step_is_not_a_loop(sink: SpanSink) -> None:
    @guard.tool
    def read_config(path: str) -> str:
        return "debug: false"

    @guard.tool
    def write_file(path: str) -> str:
        return f"wrote {path}"

    @guard.run(agent="writer")
    def agent() -> int:
        for i in range(12):
            with guard.step():
                read_config("app.yaml")
                write_file(f"out/{i}.txt")
        return i

    assert agent() == 11
    (run,) = sink.attributes("invoke_agent writer")
    assert {a.get(PROGRESS) for a in _steps(sink, run["guard.run.id"])} == {True}


# -- through a real guard ---------------------------------------------------------------------
def test_the_guard_does_not_stop_a_poll_and_its_policy_declares_polls_over_the_wire() -> None:
    policy = {"runs": {"loop": {"poll_tools": ["job_status"], "max_unchanged_polls": 6}}}
    store = MemorySink()
    with ServerThread(PolicyConfig.from_dict(policy), sink=store) as srv:
        with capture_spans(endpoint=srv.address, hmac_key=b"k" * 16, admit_timeout_ms=3000):

            @guard.run(agent="waiter")
            def agent(answers: list[str]) -> str:
                for status in answers:
                    with guard.step() as step:
                        step.tool_call("job_status", {"id": "j1"}, result=status)
                return status

            assert agent(["pending"] * 5 + ["done"]) == "done"
            with pytest.raises(guard.RunStopped) as stop:
                agent(["pending"] * 20)
            guard.shutdown()
        o = stop.value.outcome
        assert (o.reason, o.tool_calls, o.decided_by) == ("loop_detected", 6, "sdk")
        assert store.wait_for(lambda s: len(s.runs) == 2)
        done = [r for r in store.runs if r.run_id != o.run_id]
        assert [(r.reason, r.tool_calls) for r in done] == [("final_answer", 6)]


def test_poll_settings_go_over_the_wire_and_unset_means_no_bound_on_that_side() -> None:
    limits = Limits(loop=LoopSettings(poll_tools=("job_status",), max_unchanged_polls=7))
    back = limits_from_pb(limits_to_pb(limits))
    assert (back.loop.poll_tools, back.loop.max_unchanged_polls) == (("job_status",), 7)
    off = limits_from_pb(limits_to_pb(Limits(loop=LoopSettings(max_unchanged_polls=None))))
    assert off.loop.max_unchanged_polls is None
    assert Limits().tighten(off).loop.max_unchanged_polls == 10  # the side with a bound wins
