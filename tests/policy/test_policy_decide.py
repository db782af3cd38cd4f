"""The decision function: fixed order, phases, soft thresholds, reserve, messages."""

from __future__ import annotations

import pytest
from _hyp import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from guard.policy import (
    CONTINUE,
    Action,
    Budget,
    Decision,
    Limits,
    LoopVerdict,
    Phase,
    Reason,
    SoftLevel,
    Status,
    Usage,
    decide,
)

LOOP_STOP = LoopVerdict(Action.STOP, Reason.LOOP_DETECTED, "exact_repeat", 3, "loop x3")
LOOP_WARN = LoopVerdict(Action.WARN, Reason.LOOP_DETECTED, "exact_repeat", 2, "loop x2")
STALE_STOP = LoopVerdict(Action.STOP, Reason.NO_PROGRESS, "no_state_change", 8, "stale x8")

ALL = Limits(
    max_steps=10,
    max_tool_calls=10,
    max_tokens=1000,
    max_cost_usd=1.0,
    deadline_s=100.0,
    reserve_tokens=100,
    reserve_s=10.0,
)
OVER = Usage(steps=10, tool_calls=10, input_tokens=1000, cost_usd=1.0)

# Each row removes the winner of the previous one: the order is
# cancel -> completed -> deadline -> max steps -> tokens -> cost -> tool quota -> loop -> reserve
ORDER = [
    ({"cancel": Reason.OPERATOR_CANCEL}, OVER, 100.0, LOOP_STOP, Reason.OPERATOR_CANCEL),
    ({"completed": True}, OVER, 100.0, LOOP_STOP, Reason.FINAL_ANSWER),
    ({}, OVER, 100.0, LOOP_STOP, Reason.DEADLINE),
    ({}, OVER, 5.0, LOOP_STOP, Reason.MAX_STEPS),
    (
        {},
        Usage(steps=1, tool_calls=10, input_tokens=1000, cost_usd=1.0),
        5.0,
        LOOP_STOP,
        Reason.TOKEN_BUDGET,
    ),
    (
        {},
        Usage(steps=1, tool_calls=10, input_tokens=10, cost_usd=1.0),
        5.0,
        LOOP_STOP,
        Reason.COST_BUDGET,
    ),
    (
        {},
        Usage(steps=1, tool_calls=10, input_tokens=10, cost_usd=0.1),
        5.0,
        LOOP_STOP,
        Reason.MAX_TOOL_CALLS,
    ),
    (
        {},
        Usage(steps=1, tool_calls=1, input_tokens=10, cost_usd=0.1),
        5.0,
        LOOP_STOP,
        Reason.LOOP_DETECTED,
    ),
    (
        {},
        Usage(steps=1, tool_calls=1, input_tokens=10, cost_usd=0.1),
        5.0,
        STALE_STOP,
        Reason.NO_PROGRESS,
    ),
    (
        {},
        Usage(steps=1, tool_calls=1, input_tokens=10, cost_usd=0.1),
        95.0,
        None,
        Reason.DEADLINE,
    ),  # reserve: wrap up
]


@pytest.mark.parametrize(("kw", "usage", "elapsed", "loop", "reason"), ORDER)
def test_fixed_order(kw: dict, usage: Usage, elapsed: float, loop, reason: Reason) -> None:
    d = decide(ALL, usage, elapsed_s=elapsed, loop=loop, **kw)
    assert d.reason is reason
    if reason is Reason.DEADLINE and elapsed < 100:
        assert d.action is Action.WRAP_UP and d.status is None
    else:
        assert d.action is Action.STOP


@pytest.mark.parametrize(
    ("reason", "status"),
    [
        (Reason.USER_CANCEL, Status.CANCELLED),
        (Reason.OPERATOR_CANCEL, Status.CANCELLED),
        (Reason.TENANT_BUDGET, Status.TERMINATED),
        (Reason.AGENT_LOST, Status.FAILED),
    ],
)
def test_cancel_status_follows_reason(reason: Reason, status: Status) -> None:
    d = decide(Limits(), Usage(), elapsed_s=0.0, cancel=reason, cancel_detail="pressed Stop")
    assert (d.action, d.status, d.reason) == (Action.STOP, status, reason)
    assert "pressed Stop" in d.message


def test_completion_wins_over_a_budget_reached_in_the_same_step() -> None:
    d = decide(
        Limits(max_steps=3, max_tokens=100),
        Usage(steps=3, input_tokens=500),
        elapsed_s=1.0,
        phase=Phase.AFTER_MODEL_CALL,
        completed=True,
    )
    assert (d.action, d.status, d.reason) == (Action.STOP, Status.COMPLETED, Reason.FINAL_ANSWER)


@pytest.mark.parametrize(
    ("phase", "steps", "stops"),
    [
        (Phase.BEFORE_STEP, 11, False),
        (Phase.BEFORE_STEP, 12, True),  # no room for a 13th step
        (Phase.AFTER_MODEL_CALL, 12, False),  # inside the 12th step: still allowed
        (Phase.AFTER_TOOL_BATCH, 12, False),
        (Phase.AFTER_MODEL_CALL, 13, True),
        (Phase.AFTER_TOOL_BATCH, 13, True),
    ],
)
def test_max_steps_by_phase(phase: Phase, steps: int, stops: bool) -> None:
    lim = Limits(max_steps=12)
    d = decide(lim, Usage(steps=steps), elapsed_s=None, phase=phase)
    assert d.stop is stops
    if stops:
        assert d.reason is Reason.MAX_STEPS and d.status is Status.TERMINATED


def test_before_step_under_the_cap_continues() -> None:
    d = decide(Limits(max_steps=12, soft_thresholds=()), Usage(steps=11), elapsed_s=None)
    assert d.action is Action.CONTINUE


@pytest.mark.parametrize(
    ("limits", "usage", "elapsed", "message"),
    [
        (Limits(max_steps=12), Usage(steps=12), None, "max_steps 12 reached (steps=12)"),
        (
            Limits(max_model_calls=5),
            Usage(model_calls=5),
            None,
            "max_model_calls 5 reached (model_calls=5)",
        ),
        (
            Limits(max_tokens=1000),
            Usage(input_tokens=900, output_tokens=150),
            None,
            "max_tokens 1000 reached (tokens=1050: input=900 output=150)",
        ),
        (
            Limits(max_cost_usd=0.5),
            Usage(cost_usd=0.5),
            None,
            "max_cost_usd 0.5 reached (cost_usd=0.500000)",
        ),
        (
            Limits(max_tool_calls=40),
            Usage(tool_calls=40),
            None,
            "max_tool_calls 40 reached (tool_calls=40)",
        ),
        (Limits(deadline_s=90), Usage(), 90.25, "deadline_s 90 reached (elapsed_s=90.250)"),
    ],
)
def test_messages_carry_the_numbers(limits, usage, elapsed, message) -> None:
    d = decide(limits, usage, elapsed_s=elapsed)
    assert d.stop and d.message == message
    assert d.utilisation is not None and d.utilisation >= 1.0


@pytest.mark.parametrize(
    ("tokens", "action", "reason"),
    [
        (600, Action.CONTINUE, None),
        (699, Action.CONTINUE, None),
        (700, Action.WARN, Reason.TOKEN_BUDGET),
        (899, Action.WARN, Reason.TOKEN_BUDGET),
        (900, Action.WRAP_UP, Reason.TOKEN_BUDGET),
        (999, Action.WRAP_UP, Reason.TOKEN_BUDGET),
        (1000, Action.STOP, Reason.TOKEN_BUDGET),
    ],
)
def test_soft_thresholds_default_70_90(tokens: int, action: Action, reason) -> None:
    d = decide(Limits(max_tokens=1000), Usage(input_tokens=tokens), elapsed_s=None)
    assert (d.action, d.reason) == (action, reason)
    assert d.utilisation == pytest.approx(tokens / 1000)
    assert d.metric == "tokens"
    if action in (Action.WARN, Action.WRAP_UP):
        assert d.status is None and "%" in d.message


def test_custom_soft_thresholds() -> None:
    lim = Limits(max_steps=10, soft_thresholds=(0.5, 0.6))
    assert decide(lim, Usage(steps=5), elapsed_s=None).action is Action.WARN
    assert decide(lim, Usage(steps=6), elapsed_s=None).action is Action.WRAP_UP


def test_final_answer_reserve_is_held_back_from_the_working_budget() -> None:
    lim = Limits(max_tokens=10_000, reserve_tokens=2_000, soft_thresholds=())
    assert decide(lim, Usage(input_tokens=7_999), elapsed_s=None).action is Action.CONTINUE
    d = decide(lim, Usage(input_tokens=8_000), elapsed_s=None)
    assert (d.action, d.reason, d.status) == (Action.WRAP_UP, Reason.TOKEN_BUDGET, None)
    assert "2000 tokens reserved for the final answer" in d.message
    # outstanding reservations count toward the working budget
    d = decide(lim, Usage(input_tokens=7_000), elapsed_s=None, reserved=Usage(input_tokens=1_000))
    assert d.action is Action.WRAP_UP
    # only the hard limit stops
    assert decide(lim, Usage(input_tokens=10_000), elapsed_s=None).stop


def test_reserve_seconds() -> None:
    lim = Limits(deadline_s=60, reserve_s=10, soft_thresholds=())
    assert decide(lim, Usage(), elapsed_s=49.9).action is Action.CONTINUE
    d = decide(lim, Usage(), elapsed_s=50.0)
    assert (d.action, d.reason) == (Action.WRAP_UP, Reason.DEADLINE)
    assert decide(lim, Usage(), elapsed_s=60.0).stop


def test_loop_warn_is_a_warn_and_loop_stop_a_stop() -> None:
    d = decide(Limits(), Usage(), elapsed_s=None, loop=LOOP_WARN)
    assert (d.action, d.reason, d.message) == (Action.WARN, Reason.LOOP_DETECTED, "loop x2")
    d = decide(Limits(), Usage(), elapsed_s=None, loop=LOOP_STOP)
    assert (d.action, d.status, d.reason) == (
        Action.STOP,
        Status.TERMINATED,
        Reason.LOOP_DETECTED,
    )


def test_no_limits_continue() -> None:
    assert decide(Limits(), Usage(steps=10**6), elapsed_s=1e6) == CONTINUE


def test_unpriced_cost_never_stops() -> None:
    d = decide(Limits(max_cost_usd=0.01), Usage(cost_usd=None), elapsed_s=None)
    assert d.action is Action.CONTINUE


def test_spend_limits_stop_when_reached_in_every_phase() -> None:
    for phase in Phase:
        d = decide(Limits(max_tool_calls=3), Usage(tool_calls=3), elapsed_s=None, phase=phase)
        assert d.reason is Reason.MAX_TOOL_CALLS


# -- SoftLevel ---------------------------------------------------------------------------------


def _d(action: Action) -> Decision:
    return Decision(action)


@pytest.mark.parametrize(
    ("sequence", "emitted"),
    [
        ([Action.WARN, Action.WARN, Action.WRAP_UP, Action.WRAP_UP], [Action.WARN, Action.WRAP_UP]),
        ([Action.WRAP_UP, Action.WARN], [Action.WRAP_UP]),
        ([Action.CONTINUE, Action.STOP], []),
        ([Action.CONTINUE, Action.WARN, Action.CONTINUE, Action.WARN], [Action.WARN]),
    ],
)
def test_soft_level_emits_each_once_in_order(sequence, emitted) -> None:
    s = SoftLevel()
    got = [a for a in (s.advance(_d(x)) for x in sequence) if a is not None]
    assert got == emitted


# -- property: steps never exceed max_steps ----------------------------------------------------

_EVENT = st.sampled_from(["step", "model", "tools", "model", "tools"])


@settings(max_examples=examples(200), deadline=None)
@given(
    max_steps=st.integers(min_value=1, max_value=30),
    events=st.lists(_EVENT, min_size=1, max_size=200),
    tokens=st.integers(min_value=0, max_value=500),
)
def test_steps_never_exceed_max_steps(max_steps: int, events: list[str], tokens: int) -> None:
    """An agent loop that obeys BEFORE_STEP and AFTER_* decisions never runs a step too many."""
    b = Budget(Limits(max_steps=max_steps, max_tokens=10_000, max_tool_calls=50))
    in_step = False
    for ev in events:
        if ev == "step" or not in_step:
            if b.decide(phase=Phase.BEFORE_STEP).stop:
                break
            b.record_step()
            in_step = True
            continue
        if ev == "model":
            b.record_model_call(input_tokens=tokens, output_tokens=tokens // 10)
            phase = Phase.AFTER_MODEL_CALL
        else:
            b.record_tool_calls(2)
            phase = Phase.AFTER_TOOL_BATCH
        if b.decide(phase=phase).stop:
            break
        assert b.usage().steps <= max_steps
    assert b.usage().steps <= max_steps
