"""Progress derived from tool results (guard.policy.ResultNovelty), alone and feeding the loop
detector the way the SDK does for steps whose code reports no progress."""

from __future__ import annotations

import pytest

from guard.errors import ConfigError
from guard.policy import Action, Fingerprinter, LoopDetector, LoopSettings, Reason, ResultNovelty

FP = Fingerprinter(b"novelty-test-key")


def _r(value: object) -> str:
    return FP.result(value)


def test_a_step_with_a_new_result_is_progress_and_one_with_only_seen_results_is_not() -> None:
    n = ResultNovelty()
    assert n.observe(_r("row 1")) is True
    assert n.end_step() == (True, False)
    assert n.observe(_r("row 1")) is False
    assert n.end_step() == (False, False)
    n.observe(_r("row 1"))
    assert n.observe(_r("row 2")) is True  # one new result among seen ones: progress
    assert n.end_step() == (True, False)


def test_no_calls_or_calls_without_results_say_nothing() -> None:
    n = ResultNovelty()
    assert n.end_step() == (None, False)
    n.observe(None)  # a call that reported no result
    assert n.end_step() == (None, False)


def test_errors_count_as_results_and_the_same_error_again_is_not_new() -> None:
    n = ResultNovelty()
    err = _r({"error": "TimeoutError"})  # how the SDK hashes a failed call
    n.observe(err)
    assert n.end_step() == (True, False)
    n.observe(err)
    assert n.end_step() == (False, False)


def test_a_step_that_only_polled_is_neither_progress_nor_stale() -> None:
    n = ResultNovelty()
    n.note_poll()
    n.note_poll()
    assert n.end_step() == (None, True)
    n.observe(_r("a"))
    n.note_poll()  # polls beside other calls: the other calls decide
    assert n.end_step() == (True, False)
    n.observe(_r("a"))
    n.note_poll()
    assert n.end_step() == (False, False)


def test_memory_is_bounded_and_a_result_older_than_the_capacity_counts_as_new() -> None:
    n = ResultNovelty(capacity=4)
    for i in range(5):
        assert n.observe(_r(i))
    assert n.observe(_r(4)) is False
    assert n.observe(_r(0)) is True  # pushed out: new again (errs towards progress)
    assert n.observe(_r(4)) is False and n.observe(_r(1)) is True  # the ring moved on
    full = ResultNovelty()
    for i in range(1000):
        full.observe(_r(i))
    assert len(full._known) == full.capacity == 64
    assert full.nbytes() < 16_000  # 64 results as 64-bit ints, in a ring and a set
    with pytest.raises(ConfigError):
        ResultNovelty(capacity=0)


def test_reset_forgets_every_result() -> None:
    n = ResultNovelty()
    n.observe(_r("a"))
    n.reset()
    assert n.observe(_r("a")) is True


# -- fed to the detector as the SDK does ------------------------------------------------------
def _run(steps: list[list[tuple[str, dict, object]]], settings: LoopSettings | None = None):
    """Each step's calls into the detector and the novelty, then the derived progress into
    end_step: the first verdict above CONTINUE with its step index, or None."""
    settings = settings or LoopSettings()
    det, nov = LoopDetector(settings), ResultNovelty()
    for index, calls in enumerate(steps, 1):
        for tool, args, result in calls:
            r = _r(result)
            v = det.observe_action(FP.action(tool, args), r)
            nov.observe(r)
            if v.level is Action.STOP:
                return index, v
        progress, only_polled = nov.end_step()
        v = det.end_step(state=None, progress=progress, acted=bool(calls) and not only_polled)
        if v.level is Action.STOP:
            return index, v
    return None


def test_searches_that_only_find_results_seen_before_stop_as_no_progress() -> None:
    # New queries every step (no repeat, no cycle), results cycling among three seen ones.
    steps = [[("search", {"q": f"query {i}"}, ["a", "b", "c"][i % 3])] for i in range(30)]
    index, v = _run(steps, LoopSettings(no_progress_steps=4))
    assert (v.reason, v.pattern) == (Reason.NO_PROGRESS, "no_state_change")
    assert index == 3 + 4  # three steps of new results, then four stale ones


def test_a_fan_out_over_users_with_distinct_rows_never_stops() -> None:
    steps = [[("get_user", {"id": i}, {"id": i, "name": f"user {i}"})] for i in range(15)]
    assert _run(steps) is None


def test_a_config_reread_beside_a_new_file_each_step_is_exempt_from_the_repeat_count() -> None:
    steps = [
        [("read_config", {"path": "app.yaml"}, "debug: false"), ("write", {"n": i}, f"wrote {i}")]
        for i in range(12)
    ]
    assert _run(steps) is None
    # Without the derived progress the third read is a repeat (the case this prevents).
    det = LoopDetector()
    verdicts = []
    for calls in steps[:3]:
        for tool, args, result in calls:
            verdicts.append(det.observe_action(FP.action(tool, args), _r(result)))
        det.end_step(state=None, progress=None, acted=True)
    assert verdicts[-2].level is Action.STOP


def test_the_policy_read_again_for_each_new_customer_never_stops() -> None:
    steps = [
        [
            ("refund_policy", {}, "refunds within 30 days"),
            ("lookup_order", {"customer": c}, {"customer": c, "order": 100 + c}),
        ]
        for c in range(15)
    ]
    assert _run(steps) is None
