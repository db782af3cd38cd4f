"""The budget's escalation paths are decide(), filtered by the run's level, and nothing else.

``Budget.escalation`` and the record-then-decide paths the SDK runs three times per step
(``step_if_no_escalation``, ``model_call_escalation``, ``tool_call_escalation``) skip the
full evaluation when their trigger points rule it out. Whatever they skip, they must answer
exactly what ``decide()`` answers when that outranks the caller's level, and ``None`` when it
does not: hypothesis properties against ``Budget.decide`` on the same state.
"""

from __future__ import annotations

import contextlib

import pytest
from _hyp import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guard.errors import BudgetExceeded, InvalidInput
from guard.policy import (
    METRIC_REASON,
    Action,
    Budget,
    Decision,
    Limits,
    LoopVerdict,
    Phase,
    Reason,
    Usage,
    utilisation,
)

_opt_int = st.one_of(st.none(), st.integers(min_value=0, max_value=50))
_opt_float = st.one_of(st.none(), st.floats(min_value=0, max_value=50, allow_nan=False))
_LEVELS = [Action.CONTINUE, Action.WARN, Action.WRAP_UP, Action.STOP]
_LOOPS = [
    None,
    LoopVerdict(Action.WARN, Reason.LOOP_DETECTED, "exact_repeat", 2, "looping"),
    LoopVerdict(Action.STOP, Reason.LOOP_DETECTED, "exact_repeat", 3, "looping"),
    LoopVerdict(Action.STOP, Reason.NO_PROGRESS, "no_progress", 8, "stuck"),
]


@st.composite
def _limits(draw: st.DrawFn) -> Limits:
    soft = draw(
        st.one_of(
            st.just(()),
            st.tuples(st.floats(min_value=0, max_value=1.2)),
            st.tuples(st.floats(min_value=0, max_value=1.2), st.floats(min_value=0, max_value=1.2)),
        )
    )
    return Limits(
        max_steps=draw(_opt_int),
        max_tool_calls=draw(_opt_int),
        max_model_calls=draw(_opt_int),
        max_tokens=draw(st.one_of(st.none(), st.integers(min_value=0, max_value=5000))),
        max_cost_usd=draw(_opt_float),
        deadline_s=draw(_opt_float),
        reserve_tokens=draw(st.one_of(st.none(), st.integers(min_value=0, max_value=2000))),
        reserve_s=draw(st.one_of(st.none(), st.floats(min_value=0, max_value=20))),
        soft_thresholds=soft,
    )


@st.composite
def _usage(draw: st.DrawFn) -> Usage:
    return Usage(
        steps=draw(st.integers(0, 60)),
        model_calls=draw(st.integers(0, 60)),
        tool_calls=draw(st.integers(0, 60)),
        input_tokens=draw(st.integers(0, 6000)),
        output_tokens=draw(st.integers(0, 600)),
        cost_usd=draw(st.one_of(st.none(), st.floats(min_value=0, max_value=60))),
    )


def _expected(b: Budget, phase: Phase, loop: LoopVerdict | None, rank: int) -> Decision | None:
    """The reference: the full decision, when it outranks the level ``rank``."""
    d = b.decide(phase=phase, loop=loop)
    return d if d.action.rank > rank else None


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@settings(max_examples=examples(700), deadline=None)
@given(
    limits=_limits(),
    usage=_usage(),
    elapsed=st.floats(min_value=0, max_value=60),
    reserved=st.integers(min_value=0, max_value=3000),
    phase=st.sampled_from(list(Phase)),
    above=st.sampled_from(_LEVELS),
    loop=st.sampled_from(_LOOPS),
)
def test_escalation_is_decide_where_it_outranks_the_level(
    limits: Limits,
    usage: Usage,
    elapsed: float,
    reserved: int,
    phase: Phase,
    above: Action,
    loop: LoopVerdict | None,
) -> None:
    clock = _Clock()
    b = Budget(limits, clock=clock)
    b.restore(usage)
    if reserved:
        with contextlib.suppress(BudgetExceeded):  # no room: then a state without one
            b.reserve(tokens=reserved)
    clock.t = elapsed
    assert b.escalation(phase=phase, loop=loop, above=above) == _expected(
        b, phase, loop, above.rank
    )


# One operation of a run: ("step",), ("model", in, out, cost), ("tool", attempts, loop), or
# ("tick", seconds): the clock moves.
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("step")),
        st.tuples(
            st.just("model"),
            st.integers(0, 400),
            st.integers(0, 60),
            st.one_of(st.none(), st.floats(min_value=0, max_value=0.01)),
        ),
        st.tuples(st.just("tool"), st.integers(0, 3), st.sampled_from(_LOOPS)),
        st.tuples(st.just("tick"), st.floats(min_value=0, max_value=3)),
    ),
    max_size=40,
)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(limits=_limits(), ops=_OPS, rank=st.integers(0, 2))
def test_record_then_escalation_paths_are_record_then_decide(
    limits: Limits, ops: list[tuple], rank: int
) -> None:
    """Each fused path leaves the usage and record number that record_*() leaves, and returns
    the escalation decide() gives right after that record."""
    clock = _Clock()
    fused, ref = Budget(limits, clock=clock), Budget(limits, clock=clock)
    for op in ops:
        kind = op[0]
        if kind == "tick":
            clock.t += op[1]
            continue
        if kind == "step":
            want = _expected(ref, Phase.BEFORE_STEP, None, rank)
            seq = fused.step_if_no_escalation(rank)
            assert bool(seq) == (want is None)  # recorded only when nothing outranks the level
            if not seq:
                seq = fused.record_step()
            assert seq == ref.record_step()
        elif kind == "model":
            _, inp, out, cost = op
            seq, got = fused.model_call_escalation(inp, out, 0, 0, cost, rank)
            assert seq == ref.record_model_call(input_tokens=inp, output_tokens=out, cost_usd=cost)
            assert got == _expected(ref, Phase.AFTER_MODEL_CALL, None, rank)
        else:
            _, attempts, loop = op
            seq, got = fused.tool_call_escalation(attempts, None, loop, rank)
            assert seq == ref.record_tool_calls(1, attempts=attempts)
            assert got == _expected(ref, Phase.AFTER_TOOL_BATCH, loop, rank)
        assert fused.usage() == ref.usage() and fused.seq == ref.seq


def test_escalation_at_exact_trigger_points() -> None:
    """Usage exactly at a soft threshold or limit, where float rounding could bite."""
    for limit in (3, 7, 10, 12, 100, 1000, 60_000):
        # 0.07, 0.14, 0.56: fraction * limit rounds above the count whose used / limit is it
        for frac in (0.7, 0.9, 1.0, 0.333, 0.1, 0.07, 0.14, 0.56):
            lim = Limits(max_tokens=limit, max_steps=limit, soft_thresholds=(frac, frac))
            for used in range(max(0, int(limit * frac) - 2), int(limit * frac) + 3):
                b = Budget(lim)
                b.restore(Usage(input_tokens=used, steps=used))
                for above in _LEVELS:
                    for phase in Phase:
                        want = _expected(b, phase, None, above.rank)
                        assert b.escalation(phase=phase, above=above) == want, (limit, frac, used)


def test_escalation_of_a_nested_run_counts_its_spend_in_every_ancestor() -> None:
    root = Budget(Limits(max_steps=100, max_tokens=1000))
    mid = Budget(Limits(), parent=root)
    leaf = Budget(Limits(), parent=mid)
    for _ in range(3):
        assert leaf.step_if_no_escalation()
    leaf.model_call_escalation(900, 0, 0, 0, None)
    leaf.tool_call_escalation(2, None, None)
    for b in (root, mid, leaf):
        u = b.usage()
        assert (u.steps, u.input_tokens, u.tool_calls, u.tool_attempts) == (3, 900, 1, 2)
    # the root's 90% wrap-up threshold is passed by the leaf's spend
    assert root.escalation(above=Action.WARN) == _expected(root, Phase.BEFORE_STEP, None, 1)
    assert root.escalation(above=Action.WARN) is not None


def test_a_wrong_count_is_refused_and_records_nothing() -> None:
    b = Budget(Limits())
    with pytest.raises(InvalidInput, match="input_tokens"):  # record_model_call's validation
        b.model_call_escalation(-1, 0, 0, 0, None)
    assert b.usage() == Usage() and b.seq == 0


def test_action_rank_orders_actions_by_strength() -> None:
    assert [a.rank for a in Action] == [0, 1, 2, 3]
    assert Action.STOP.rank > Action.WRAP_UP.rank > Action.WARN.rank > Action.CONTINUE.rank


def test_every_metric_utilisation_names_has_its_reason() -> None:
    """Soft decisions (and the guard's forecasts) report a metric's reason from one table."""
    cases = {
        "steps": (Limits(max_steps=10), Usage(steps=8)),
        "model_calls": (Limits(max_model_calls=10), Usage(model_calls=8)),
        "tokens": (Limits(max_tokens=10), Usage(input_tokens=8)),
        "cost_usd": (Limits(max_cost_usd=1.0), Usage(cost_usd=0.8)),
        "tool_calls": (Limits(max_tool_calls=10), Usage(tool_calls=8)),
        "elapsed_s": (Limits(deadline_s=10.0), Usage()),
    }
    for metric, (limits, usage) in cases.items():
        clock = _Clock()
        b = Budget(limits, clock=clock)
        b.restore(usage)
        clock.t = 8.0
        assert utilisation(limits, usage, 8.0 if metric == "elapsed_s" else 0.0)[1] == metric
        d = b.escalation(above=Action.CONTINUE)
        assert d is not None and d.action is Action.WARN and d.metric == metric
        assert d.reason is METRIC_REASON[metric]
    assert set(METRIC_REASON) == set(cases)


@pytest.mark.parametrize("limit", [5e-324, 1e-310, 2.2e-308])
def test_a_subnormal_trigger_point_still_lets_an_unused_budget_pass(limit: float) -> None:
    """fraction * limit underflowing to 0 made an unused budget look reached: the fast path
    then refused a step that decide() lets through (found by hypothesis at deadline 5e-324)."""
    for field in ("deadline_s", "max_cost_usd"):
        lim = Limits(**{field: limit}, soft_thresholds=(0.5, 0.9))
        clock = _Clock()
        fused, ref = Budget(lim, clock=clock), Budget(lim, clock=clock)
        assert _expected(ref, Phase.BEFORE_STEP, None, 0) is None
        assert fused.step_if_no_escalation(0) == ref.record_step() == 1


def test_a_subnormal_usage_under_a_subnormal_limit_keeps_the_fast_path() -> None:
    """The smallest positive float as the trigger point was above a spend of 5e-324 under a
    1.1e-308 cost limit, which decide() lets pass: the fast path refused the step (found by
    hypothesis)."""
    lim = Limits(max_cost_usd=1.1125369292536007e-308)
    clock = _Clock()
    fused, ref = Budget(lim, clock=clock), Budget(lim, clock=clock)
    assert fused.model_call_escalation(0, 0, 0, 0, 5e-324) == (1, None)
    ref.record_model_call(cost_usd=5e-324)
    assert _expected(ref, Phase.BEFORE_STEP, None, 0) is None
    assert fused.step_if_no_escalation(0) == ref.record_step() == 2
