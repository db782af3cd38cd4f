"""The run's call ledger: which tool calls of its conversation a run has accounted for."""

from __future__ import annotations

import threading

from guard.sdk._tool_ledger import ToolLedger, claim_invocation, invoking


def test_only_calls_a_response_of_the_run_asked_for_are_claimed_and_each_once() -> None:
    led = ToolLedger()
    assert led.claim("call_from_an_earlier_turn") is None  # history: never asked in this run
    led.ask("c1", "lookup", '{"q": "a"}')
    assert led.claim("c1") == ("lookup", '{"q": "a"}')
    assert led.claim("c1") is None  # counted once
    led.ask("c2", "lookup", "{}")
    led.recorded("c2", "lookup", "fp")  # the framework that ran it recorded it by its id
    assert led.claim("c2") is None
    led.recorded("c3", "lookup", "fp")
    led.ask("c3", "lookup", "{}")  # asked after it was recorded: still the same call
    assert led.claim("c3") is None


def _claim_from_threads(led: ToolLedger, call_id: str, n: int) -> list[object]:
    got: list[object] = []
    barrier = threading.Barrier(n)

    def read() -> None:
        barrier.wait()
        got.append(led.claim(call_id))

    threads = [threading.Thread(target=read) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def test_two_requests_carrying_the_same_result_claim_it_once() -> None:
    for _ in range(50):
        led = ToolLedger()
        led.ask("c", "t", None)
        got = _claim_from_threads(led, "c", 4)
        assert sorted(map(repr, got)) == sorted(["('t', None)", "None", "None", "None"])


def test_a_recording_without_a_call_id_matches_its_action_then_its_tool_then_the_oldest() -> None:
    led = ToolLedger()
    led.recorded(None, "search", "fp-search-a")
    led.recorded(None, "fetch", "fp-fetch-b")
    led.recorded(None, "other", "fp-other")
    assert led.take_unnamed("fetch", "fp-fetch-b")  # the same action
    assert led.take_unnamed("search", "fp-search-zzz")  # the same tool, arguments bound otherwise
    assert led.take_unnamed("lookup", "fp-lookup")  # the oldest left: recorded under its own name
    assert not led.take_unnamed("lookup", "fp-lookup")
    led.recorded(None, "log_event", "fp-log")  # code calling a @guard.tool on its own
    led.read_back()  # a request read without matching it: it waits for no later one
    assert not led.take_unnamed("lookup", "fp-lookup")


def test_a_recording_inside_a_framework_invocation_is_that_call_once_and_only_its_runs() -> None:
    run, other = object(), object()
    assert claim_invocation(run) is None  # no framework invocation around
    with invoking(run, "call_7") as inv:
        assert claim_invocation(other) is None  # another run's recording is its own call
        assert claim_invocation(run) is inv and inv.by_code and inv.call_id == "call_7"
        assert claim_invocation(run) is None  # a second recording inside is a call of its own
    assert claim_invocation(run) is None
