"""Loop and stagnation detection: patterns, thresholds, exemptions, memory."""

from __future__ import annotations

import pytest
from _hyp import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from guard.errors import ConfigError
from guard.policy import Action, Fingerprinter, LoopDetector, LoopSettings, Reason

FP = Fingerprinter(b"test-key")


def act(name: str) -> str:
    return FP.action(name, {})


def res(name: str | None) -> str | None:
    return None if name is None else FP.result(name)


def feed(det: LoopDetector, calls: list[tuple[str, str | None]]) -> list[Action]:
    return [det.observe_action(act(a), res(r)).level for a, r in calls]


C, W, S = Action.CONTINUE, Action.WARN, Action.STOP


@pytest.mark.parametrize(
    ("name", "calls", "levels", "pattern"),
    [
        ("exact repeat", [("a", "r")] * 3, [C, W, S], "exact_repeat"),
        ("unknown results repeat", [("a", None)] * 3, [C, W, S], "exact_repeat"),
        (
            "repeat within window",
            [("a", "r"), ("b", "1"), ("a", "r"), ("c", "2"), ("a", "r")],
            [C, C, W, C, S],
            "repeat_in_window",
        ),
        (
            "A-B alternation",
            [("a", "r"), ("b", "s")] * 3,
            [C, C, W, W, S, S],
            "cycle",
        ),
        (
            "cycle of 3",
            [("a", "1"), ("b", "2"), ("c", "3")] * 3,
            [C, C, C, W, W, W, S, S, S],
            "cycle",
        ),
        (
            "cycle of 4",
            [("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")] * 3,
            [C] * 4 + [W] * 4 + [S] * 4,
            "cycle",
        ),
        (
            "same result while args vary",
            [("a", "[]"), ("b", "[]"), ("c", "[]"), ("d", "[]"), ("e", "[]")],
            [C, C, C, W, S],
            "same_result",
        ),
        (
            "new information resets the count",
            [("a", "1"), ("a", "1"), ("a", "2"), ("a", "2"), ("a", "3")],
            [C, W, C, W, C],
            None,
        ),
        (
            "read-edit-read with changing file",
            [("read", "v1"), ("edit", "ok"), ("read", "v2"), ("edit2", "ok"), ("read", "v3")],
            [C] * 5,
            None,
        ),
        (
            "distinct calls",
            [(f"t{i}", f"r{i}") for i in range(30)],
            [C] * 30,
            None,
        ),
    ],
)
def test_patterns(name: str, calls, levels, pattern) -> None:
    det = LoopDetector()
    verdicts = [det.observe_action(act(a), res(r)) for a, r in calls]
    assert [v.level for v in verdicts] == levels, name
    stops = [v for v in verdicts if v.level is S]
    if pattern is not None:
        last = verdicts[-1]
        assert last.pattern == pattern
        assert last.reason is Reason.LOOP_DETECTED
        assert "loop_detected" in last.detail and "repeat_threshold=3" in last.detail
    else:
        assert not stops
    assert det.hits == sum(v.level is not C for v in verdicts)


def test_warn_always_comes_one_before_stop() -> None:
    for k in (2, 3, 5):
        det = LoopDetector(LoopSettings(repeat_threshold=k))
        levels = feed(det, [("a", "r")] * k)
        assert levels[-1] is S and levels[-2] is W and S not in levels[:-1]


def test_repeats_outside_the_window_are_forgotten() -> None:
    det = LoopDetector(LoopSettings(window=5, repeat_threshold=3))
    seq = [("a", "r")] + [(f"x{i}", f"{i}") for i in range(4)] + [("a", "r")]
    seq += [(f"y{i}", f"{i}") for i in range(4)] + [("a", "r")]
    assert S not in feed(det, seq)


def test_configurable_threshold() -> None:
    det = LoopDetector(LoopSettings(repeat_threshold=5))
    assert feed(det, [("a", "r")] * 5) == [C, C, C, W, S]


def test_defaults_follow_the_seeds() -> None:
    s = LoopSettings()
    assert (s.window, s.repeat_threshold, s.no_progress_steps) == (20, 3, 8)
    assert "page" in s.ignore_fields and "offset" in s.ignore_fields


def test_memory_is_compact() -> None:
    det = LoopDetector()
    for i in range(100):
        det.observe_action(act(f"t{i}"), res(f"r{i}"))
        det.end_step(state=f"s{i}", progress=None)
    assert det.nbytes() < 1024  # well under 1.5 KB for window 20
    assert LoopDetector(LoopSettings(window=100, repeat_threshold=3)).nbytes() < 2500


# -- stagnation ----------------------------------------------------------------------------


def steps(det: LoopDetector, states: list[tuple[str | None, bool | None, bool]]) -> list:
    return [det.end_step(state=s, progress=p, acted=a) for s, p, a in states]


@pytest.mark.parametrize(
    ("name", "states", "levels"),
    [
        (
            "state frozen while acting",
            [("s", None, True)] * 9,
            [C] * 7 + [W, S],  # first sighting is not stale; 7 stale -> warn, 8 -> stop
        ),
        (
            "explicit no progress",
            [(None, False, True)] * 8,
            [C] * 6 + [W, S],
        ),
        (
            "progress resets",
            [(None, False, True)] * 7 + [(None, True, True)] + [(None, False, True)] * 7,
            [C] * 6 + [W, C] + [C] * 6 + [W],
        ),
        (
            "changing state resets",
            [(f"s{i // 5}", None, True) for i in range(30)],
            [C] * 30,
        ),
        (
            "no signal is no evidence",
            [(None, None, True)] * 20,
            [C] * 20,
        ),
        (
            "model-only steps with a frozen state do not count",
            [("s", None, False)] * 20,
            [C] * 20,
        ),
    ],
)
def test_stagnation(name, states, levels) -> None:
    det = LoopDetector()
    got = steps(det, states)
    assert [v.level for v in got] == levels, name
    for v in got:
        if v.level is not C:
            assert v.reason is Reason.NO_PROGRESS and v.pattern == "no_state_change"
            assert "no_progress_steps=8" in v.detail


def test_new_results_do_not_hide_a_frozen_state() -> None:
    """Seed 000 §8.4: actions and results may vary; the task state is what must move."""
    det = LoopDetector(LoopSettings(no_progress_steps=4))
    out = []
    for i in range(5):
        det.observe_action(act(f"search{i}"), res(f"snippet{i}"))
        out.append(det.end_step(state="bug in payment.py", progress=None).level)
    assert out == [C, C, C, W, S]
    assert det.stale_steps == 4


def test_reset_forgets() -> None:
    det = LoopDetector()
    feed(det, [("a", "r")] * 2)
    det.reset()
    assert feed(det, [("a", "r")]) == [C]


@pytest.mark.parametrize(
    ("kw", "path"),
    [
        ({"window": 1}, "loop.window"),
        ({"repeat_threshold": 0}, "loop.repeat_threshold"),
        ({"no_progress_steps": 1}, "loop.no_progress_steps"),
    ],
)
def test_invalid_settings(kw: dict, path: str) -> None:
    with pytest.raises(ConfigError) as exc:
        LoopDetector(LoopSettings(**kw))
    assert exc.value.path == path


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=1000), max_size=80))
def test_all_distinct_results_never_stop(xs: list[int]) -> None:
    """Every call returns something never seen before: new information, never a loop."""
    det = LoopDetector()
    for i, x in enumerate(xs):
        v = det.observe_action(act(f"t{x % 3}"), res(f"unique-{i}"))
        assert v.level is not S
