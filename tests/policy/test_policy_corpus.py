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


# The step each loop trace was stopped in before re-reads were told apart (81ecf93, measured
# with benchmarks/loop_corpus.py on this corpus). Every loop stays caught at least as early,
# except where that stop came before the loop began (in its legitimate prefix): then within
# two steps of its start.
BASE_STOP_STEPS = {
    "exact_repeat_search": 2,
    "cjk_rephrased_repeat": 2,
    "key_order_and_case_repeat": 2,
    "search_edit_oscillation": 4,
    "refund_alternation_page_ignored": 4,
    "varied_args_same_empty_result": 4,
    "cycle_of_3": 6,
    "cycle_of_4": 8,
    "repeat_in_window_interleaved": 5,
    "stagnation_varied_actions": 8,
    "stagnation_explicit_no_progress": 7,
    "test_fix_no_improvement": 5,
    "retry_same_error": 2,
    "date_format_rotation": 2,
    "numeric_forms": 2,
    "pagination_same_page": 2,
    "three_tool_rotation_cursor_varies": 6,
    "polling_never_changes": 2,
    "rephrased_searches_no_results": 4,
    "model_only_spinning": 7,
    "browser_clicks_same_page": 4,
    "alternation_varied_args_state_frozen": 8,
    "reread_no_new_facts": 2,
    "reread_explicit_no_progress": 2,
    "reread_same_customer_forged_facts": 2,
    "alternate_two_lookups_state_frozen": 4,
    "alternate_two_lookups_new_rows_state_frozen": 8,
    "reread_between_repeated_drafts_forged_facts": 2,
    "reread_progress_then_stuck": 2,
    "reread_thrice_in_one_step": 2,
    "reread_same_customer_new_timestamps_forged_facts": 2,
    "cycle_of_5_forged_facts": 10,
    "rephrased_search_forged_facts": 2,
    "reread_facts_grow_without_new_results": 2,
}


@pytest.mark.parametrize("trace", LOOPS, ids=lambda t: t.name)
def test_loops_are_caught_at_least_as_early_as_before(trace) -> None:
    r = run_trace(trace)
    base = BASE_STOP_STEPS[trace.name]
    assert r.stop_step is not None
    if base >= trace.loop_start:
        assert r.stop_step <= base, f"{trace.name}: step {r.stop_step}, before: {base}"
    else:
        assert trace.loop_start <= r.stop_step <= trace.loop_start + 2
