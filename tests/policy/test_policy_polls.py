"""The poll rule (guard.policy.PollWatch), its settings in LoopSettings and Limits.tighten, and
the policy file's ``loop.poll_tools`` / ``loop.max_unchanged_polls``."""

from __future__ import annotations

import pytest

from guard.errors import ConfigError
from guard.policy import (
    POLL_PATTERN,
    Action,
    Fingerprinter,
    Limits,
    LoopSettings,
    PolicyConfig,
    PollWatch,
    Reason,
    parse_limits,
)
from guard.policy._polls import MAX_TRACKED_POLLS

FP = Fingerprinter(b"poll-test-key")
JOB = FP.action("job_status", {"id": "j1"})


def _levels(watch: PollWatch, results: list[str], action: str = JOB) -> list[Action]:
    return [watch.observe(action, FP.result(r)).level for r in results]


def test_a_job_pending_four_times_then_done_is_never_a_loop() -> None:
    w = PollWatch()
    assert set(_levels(w, ["pending"] * 4 + ["done"])) == {Action.CONTINUE}


def test_a_poll_stuck_on_the_same_result_warns_one_short_and_stops_at_the_threshold() -> None:
    w = PollWatch(LoopSettings(max_unchanged_polls=10))
    levels = _levels(w, ["pending"] * 10)
    assert levels[:8] == [Action.CONTINUE] * 8
    assert levels[8:] == [Action.WARN, Action.STOP]
    v = w.observe(JOB, FP.result("pending"))
    assert (v.level, v.reason, v.pattern, v.count) == (
        Action.STOP,
        Reason.LOOP_DETECTED,
        POLL_PATTERN,
        11,
    )
    assert v.detail.startswith("loop_detected: poll_unchanged: same poll with the same result")
    assert "max_unchanged_polls=10" in v.detail
    assert w.hits == 3


def test_a_changed_result_starts_the_count_again() -> None:
    w = PollWatch(LoopSettings(max_unchanged_polls=3))
    assert _levels(w, ["queued", "queued", "running", "running", "50%", "50%"]) == [
        Action.CONTINUE,
        Action.WARN,
        Action.CONTINUE,
        Action.WARN,
        Action.CONTINUE,
        Action.WARN,
    ]
    assert w.unchanged(JOB) == 2


def test_each_poll_counts_its_own_calls_in_a_row_whatever_comes_between() -> None:
    w = PollWatch(LoopSettings(max_unchanged_polls=4))
    other = FP.action("job_status", {"id": "j2"})
    for _ in range(3):
        assert w.observe(JOB, FP.result("pending")).level is not Action.STOP
        assert w.observe(other, FP.result("pending")).level is not Action.STOP
    assert w.observe(JOB, FP.result("pending")).level is Action.STOP  # j1's fourth in a row
    assert w.unchanged(other) == 3


def test_unknown_results_compare_equal_as_no_new_information() -> None:
    w = PollWatch(LoopSettings(max_unchanged_polls=2))
    assert w.observe(JOB, None).level is Action.WARN
    assert w.observe(JOB, None).level is Action.STOP


def test_null_turns_the_rule_off() -> None:
    w = PollWatch(LoopSettings(max_unchanged_polls=None))
    assert set(_levels(w, ["pending"] * 100)) == {Action.CONTINUE}


def test_adopt_keeps_the_counts_under_new_settings() -> None:
    w = PollWatch()
    _levels(w, ["pending"] * 4)
    w.adopt(LoopSettings(max_unchanged_polls=5))
    assert w.observe(JOB, FP.result("pending")).level is Action.STOP


@pytest.mark.parametrize("bad", [0, 1, True, 2.5, "10"])
def test_invalid_thresholds_are_config_errors(bad: object) -> None:
    with pytest.raises(ConfigError, match="max_unchanged_polls"):
        PollWatch(LoopSettings(max_unchanged_polls=bad))  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["job_status", ("job_status", ""), ("ok", 3), ["job_status"]])
def test_poll_tools_built_in_code_are_checked(bad: object) -> None:
    with pytest.raises(ConfigError, match="poll_tools"):
        PollWatch(LoopSettings(poll_tools=bad))  # type: ignore[arg-type]


def test_memory_is_bounded_to_the_most_recent_polls() -> None:
    w = PollWatch(LoopSettings(max_unchanged_polls=3))
    w.observe(JOB, FP.result("pending"))
    for i in range(MAX_TRACKED_POLLS):
        w.observe(FP.action("job_status", {"id": f"other {i}"}), FP.result("pending"))
    assert len(w._last) == MAX_TRACKED_POLLS
    assert w.unchanged(JOB) == 0  # pushed out: it starts again at one
    w.reset()
    assert not w._last


# -- settings ---------------------------------------------------------------------------------
def test_tighten_unites_the_declared_polls_and_takes_the_smaller_bound() -> None:
    a = Limits(loop=LoopSettings(poll_tools=("job_status",), max_unchanged_polls=None))
    b = Limits(loop=LoopSettings(poll_tools=("build_state",), max_unchanged_polls=6))
    loop = a.tighten(b).loop
    assert loop.poll_tools == ("build_state", "job_status")
    assert loop.max_unchanged_polls == 6  # a None side loses
    assert Limits().loop.max_unchanged_polls == 10
    assert (
        Limits().tighten(Limits(loop=LoopSettings(max_unchanged_polls=4))).loop.max_unchanged_polls
        == 4
    )


def test_the_policy_file_reads_poll_tools_and_max_unchanged_polls() -> None:
    cfg = PolicyConfig.from_dict(
        {"runs": {"loop": {"poll_tools": ["job_status", "build"], "max_unchanged_polls": 6}}}
    )
    assert cfg.runs.loop.poll_tools == ("job_status", "build")
    assert cfg.runs.loop.max_unchanged_polls == 6
    off = parse_limits({"loop": {"max_unchanged_polls": None}}, "runs")
    assert off.loop.max_unchanged_polls is None
    assert parse_limits({"loop": {"window": 10}}, "runs").loop.max_unchanged_polls == 10
    # The round trip through the file form keeps them.
    again = PolicyConfig.from_dict(cfg.to_dict())
    assert again.runs.loop == cfg.runs.loop


@pytest.mark.parametrize(
    ("loop", "path", "match"),
    [
        ({"poll_tools": "job_status"}, "runs.loop.poll_tools", "list of strings"),
        ({"poll_tools": ["job_status", ""]}, "runs.loop.poll_tools[1]", "non-empty"),
        ({"poll_tools": [3]}, "runs.loop.poll_tools[0]", "non-empty"),
        ({"max_unchanged_polls": 1}, "runs.loop.max_unchanged_polls", ">= 2"),
        ({"max_unchanged_polls": "10"}, "runs.loop.max_unchanged_polls", "integer"),
        ({"max_unchanged_polls": True}, "runs.loop.max_unchanged_polls", "integer"),
        ({"poll_tool": ["job_status"]}, "runs.loop.poll_tool", "unknown key"),
        ({"max_unchanged_poll": 5}, "runs.loop.max_unchanged_poll", "unknown key"),
    ],
)
def test_bad_poll_settings_and_unknown_keys_are_errors(loop: dict, path: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as err:
        PolicyConfig.from_dict({"runs": {"loop": loop}})
    assert err.value.path == path
