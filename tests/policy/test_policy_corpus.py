"""The labelled trace corpus: every loop is stopped (after a warning), no easy legit trace is."""

from __future__ import annotations

import pytest
from policy_corpus import CORPUS, run_trace

from guard.policy import LoopSettings

LOOPS = [t for t in CORPUS if t.label == "loop"]
LEGIT = [t for t in CORPUS if t.label == "legit" and not t.hard]
HARD = [t for t in CORPUS if t.label == "legit" and t.hard]


def test_corpus_size_and_labels() -> None:
    assert len(CORPUS) >= 30
    assert {t.label for t in CORPUS} == {"loop", "legit"}
    assert len({t.name for t in CORPUS}) == len(CORPUS)
    assert len(LOOPS) >= 15 and len(LEGIT) >= 15


@pytest.mark.parametrize("trace", LOOPS, ids=lambda t: t.name)
def test_loops_are_stopped_after_a_warning(trace) -> None:
    r = run_trace(trace)
    assert r.stopped, trace.name
    assert r.warned, f"{trace.name}: stopped without a warning first"


@pytest.mark.parametrize("trace", LEGIT, ids=lambda t: t.name)
def test_legit_traces_are_not_stopped(trace) -> None:
    r = run_trace(trace)
    assert not r.stopped, f"{trace.name}: stopped by {r.pattern} after {r.stop_call} calls"


@pytest.mark.parametrize("trace", HARD, ids=lambda t: t.name)
def test_hard_legit_traces_are_documented_limits(trace) -> None:
    """Known false positives (reported by benchmarks/loop_corpus.py), each with its reason.

    Hashes alone cannot tell "ok" x8 from "[]" x8; a looser threshold lets them through.
    """
    assert trace.note
    assert run_trace(trace).stopped
    assert not run_trace(trace, LoopSettings(window=20, repeat_threshold=8)).stopped


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("exact_repeat_search", "exact_repeat"),
        ("cjk_rephrased_repeat", "exact_repeat"),
        ("search_edit_oscillation", "cycle"),
        ("cycle_of_3", "cycle"),
        ("cycle_of_4", "cycle"),
        ("repeat_in_window_interleaved", "repeat_in_window"),
        ("varied_args_same_empty_result", "same_result"),
        ("stagnation_varied_actions", "no_state_change"),
    ],
)
def test_patterns_are_named(name: str, pattern: str) -> None:
    trace = next(t for t in CORPUS if t.name == name)
    assert run_trace(trace).pattern == pattern
