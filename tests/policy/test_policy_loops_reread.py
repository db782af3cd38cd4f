"""Re-reading alongside new work is not a loop; exact repeats, cycles, varied arguments with the
same result and stagnation stay loops, caught as early as before (issue 13 §4)."""

from __future__ import annotations

import pytest
from _hyp import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from guard.policy import Action, Fingerprinter, LoopDetector, LoopSettings

FP = Fingerprinter(b"test-key")
C, W, S = Action.CONTINUE, Action.WARN, Action.STOP

# A step: its calls (tool, result) and how it ends: ("grow", i) a new state, ("same",) the
# state it had, ("none",) no signal, ("progress", True/False) an explicit flag.
Step = tuple[list[tuple[str, str | None]], tuple]


def run(steps: list[Step], det: LoopDetector | None = None) -> tuple[int | None, str | None]:
    """Feed the steps; returns (calls seen when stopped, pattern) or (None, None)."""
    det = det or LoopDetector()
    n = 0
    for calls, end in steps:
        for tool, result in calls:
            n += 1
            v = det.observe_action(
                FP.action(tool, {}), None if result is None else FP.result(result)
            )
            if v.level is S:
                return n, v.pattern
        kind = end[0]
        state = f"facts {end[1]}" if kind == "grow" else "facts frozen" if kind == "same" else None
        progress = end[1] if kind == "progress" else None
        v = det.end_step(state=state, progress=progress, acted=bool(calls))
        if v.level is S:
            return n, v.pattern
    return None, None


POLICY = ("read_policy", "30 days")


def customer(i: int) -> tuple[str, str]:
    return (f"lookup_customer_{i}", f"customer {i}: order A-{i}")


@pytest.mark.parametrize(
    ("name", "steps"),
    [
        ("lookup then policy", [([customer(i), POLICY], ("grow", i)) for i in range(30)]),
        ("policy then lookup", [([POLICY, customer(i)], ("grow", i)) for i in range(30)]),
        (
            "progress flags, no state",
            [([POLICY, customer(i)], ("progress", True)) for i in range(30)],
        ),
        (
            "two references per item",
            [([POLICY, customer(i), ("read_prices", "$20")], ("grow", i)) for i in range(30)],
        ),
        (
            "the read in its own step",
            [s for i in range(20) for s in (([POLICY], ("grow", i)), ([customer(i)], ("grow", i)))],
        ),
    ],
)
def test_rereading_alongside_new_work_is_not_a_loop(name: str, steps: list[Step]) -> None:
    assert run(steps) == (None, None), name


@pytest.mark.parametrize(
    ("name", "steps", "stop"),
    [
        # The same call numbers as before the change (checked against 81ecf93).
        ("no state signal at all", [([customer(i), POLICY], ("none",)) for i in range(8)], 6),
        ("state frozen", [([customer(i), POLICY], ("same",)) for i in range(8)], 6),
        (
            "explicit no progress",
            [([customer(i), POLICY], ("progress", False)) for i in range(8)],
            6,
        ),
        (
            "facts forged, the same customer",
            [([customer(7), POLICY], ("grow", i)) for i in range(8)],
            5,
        ),
        (
            "facts forged, the same lookup with a new timestamp",
            [([("lookup_customer_7", f"fetched 12:0{i}"), POLICY], ("grow", i)) for i in range(8)],
            6,
        ),
        (
            "facts forged, varied lookups, the same empty result",
            [([(f"search_{i}", "no results"), POLICY], ("grow", i)) for i in range(8)],
            6,
        ),
        (
            "three reads within one step",
            [
                ([customer(0), POLICY], ("grow", 0)),
                ([customer(1), POLICY, POLICY, POLICY], ("grow", 1)),
            ],
            5,
        ),
    ],
)
def test_rereading_near_misses_stay_loops(name: str, steps: list[Step], stop: int) -> None:
    assert run(steps)[0] == stop, name


def test_a_frozen_first_state_is_not_growth() -> None:
    """The first state seen is only a baseline: it counts as growth once the state moves."""
    frozen = [([customer(0), POLICY], ("same",))] + [
        ([customer(i), POLICY], ("same",)) for i in range(1, 4)
    ]
    assert run(frozen)[0] == 6
    moving = [([POLICY, customer(0)], ("grow", 0)), ([customer(1), POLICY], ("grow", 1))]
    moving += [([POLICY, customer(i)], ("grow", i)) for i in range(2, 20)]
    assert run(moving) == (None, None)


def test_reset_forgets_growth() -> None:
    det = LoopDetector()
    run([([POLICY, customer(i)], ("grow", i)) for i in range(5)], det)
    det.reset()
    assert run([([customer(i), POLICY], ("same",)) for i in range(8)], det)[0] == 6


def test_growth_is_remembered_across_a_long_run() -> None:
    """The growth mask is trimmed as calls go by; separations inside the window survive it."""
    det = LoopDetector(LoopSettings(window=6, repeat_threshold=3))
    steps = [([POLICY, customer(i)], ("grow", i)) for i in range(500)]
    assert run(steps, det) == (None, None)
    assert det._gbits.bit_length() <= 3 * det.settings.window
    # ...and reads with nothing new in between still count, right after.
    assert run([([POLICY], ("grow", 1000 + i)) for i in range(3)], det)[0] == 3


def _steps_of(calls: list[tuple[str, str | None]], cuts: list[int], ends: list[tuple]) -> list:
    """``calls`` grouped into steps at the ``cuts`` (call indexes), each step ending as ``ends``
    says (cycled)."""
    bounds = sorted({c for c in cuts if 0 < c < len(calls)} | {len(calls)})
    out, start = [], 0
    for i, b in enumerate(bounds):
        end = ends[i % len(ends)]
        out.append((calls[start:b], ("grow", i) if end == ("grow",) else end))
        start = b
    return out


_ENDS = st.lists(
    st.sampled_from([("grow",), ("same",), ("none",), ("progress", True), ("progress", False)]),
    min_size=1,
    max_size=4,
)


@settings(max_examples=examples(300), deadline=None)
@given(
    p=st.integers(1, 5),
    k=st.integers(2, 4),
    prefix=st.integers(0, 6),
    cuts=st.lists(st.integers(0, 40), max_size=12),
    ends=_ENDS,
)
def test_a_cycle_is_caught_at_its_second_repetition(p, k, prefix, cuts, ends) -> None:
    """A cycle of period p (p = 1: an exact repeat) after some new work, whatever the steps
    and however the facts move, forged or frozen: stopped at call (k - 1) * p + 1 of the cycle,
    as before the change; with the default k = 3 that is its second repetition's first call."""
    calls = [(f"new_{i}", f"fresh {i}") for i in range(prefix)]
    calls += [(f"cyc_{j % p}", f"out {j % p}") for j in range(k * p)]
    det = LoopDetector(LoopSettings(repeat_threshold=k))
    stop, pattern = run(_steps_of(calls, cuts, ends), det)
    assert stop is not None and stop <= prefix + (k - 1) * p + 1
    if stop <= prefix + (k - 1) * p:  # only stagnation may stop it earlier, never a repeat
        assert pattern == "no_state_change"


@settings(max_examples=examples(200), deadline=None)
@given(prefix=st.integers(0, 6), cuts=st.lists(st.integers(0, 20), max_size=8), ends=_ENDS)
def test_varied_arguments_same_result_are_caught_as_before(prefix, cuts, ends) -> None:
    calls = [(f"new_{i}", f"fresh {i}") for i in range(prefix)]
    calls += [(f"order_query_{i}", "[]") for i in range(8)]
    stop, _ = run(_steps_of(calls, cuts, ends))
    assert stop is not None and stop <= prefix + 5  # repeat_threshold + 2


@settings(max_examples=examples(200), deadline=None)
@given(
    refs=st.integers(1, 3),
    orders=st.lists(st.permutations(range(4)), min_size=5, max_size=40),
    flags=st.booleans(),
)
def test_rereads_with_new_work_and_growing_facts_never_stop(refs, orders, flags) -> None:
    """Each step: up to three references re-read (once each) and one new lookup, in any
    order, and the facts grow (a new state, or progress=True): never a loop."""
    steps = []
    for i, order in enumerate(orders):
        items = [(f"ref_{r}", f"reference {r}") for r in range(refs)] + [customer(i)]
        calls = [items[j] for j in order if j < len(items)]
        steps.append((calls, ("progress", True) if flags else ("grow", i)))
    assert run(steps) == (None, None)


def test_stagnation_still_fires_with_new_results_and_a_frozen_state() -> None:
    det = LoopDetector(LoopSettings(no_progress_steps=4))
    steps = [([(f"search_{i}", f"snippet {i}")], ("same",)) for i in range(6)]
    assert run(steps, det) == (5, "no_state_change")
