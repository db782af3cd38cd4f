"""The heartbeat's deadline check (``DecisionRouter.check_deadline``) against the path it
replaced, ``act(run, budget.decide(AFTER_TOOL_BATCH))``, by hypothesis (issue 14 §1).

Two registries on one hand-driven clock get the same runs, the same usage and the same
heartbeats; one checks the deadline the new way, the other the old way. The decision
records they write (warn / wrap_up / cancel, with reason, detail, utilisation, metric), the
runs' soft levels and stop reasons must be identical after every heartbeat.
"""

from __future__ import annotations

import pytest
from _hyp import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guard.policy import Action, Decision, Limits, Phase, PolicyConfig
from guard.server.runs._registry import Registry
from guard.server.runs._state import RunState


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Records:
    """A sink that keeps the decision records (the runs' outcomes are not compared)."""

    def __init__(self) -> None:
        self.decisions: list[tuple] = []

    def write_run(self, outcome: object) -> None:
        pass

    def write_decision(self, r) -> None:
        self.decisions.append(
            (r.run_id, r.action, r.reason, r.detail, r.utilisation, r.metric, r.decided_by)
        )


def _old_check_deadline(reg: Registry, run: RunState) -> None:
    """The heartbeat's check before issue 14's round 2 (the reference)."""
    if run.stop_reason is None and run.budget.limits.deadline_s is not None:
        reg.act(run, run.budget.decide(phase=Phase.AFTER_TOOL_BATCH))


_opt_int = st.one_of(st.none(), st.integers(min_value=1, max_value=30))
_limits = st.builds(
    Limits,
    max_steps=_opt_int,
    max_tool_calls=_opt_int,
    max_tokens=st.one_of(st.none(), st.integers(min_value=1, max_value=5000)),
    deadline_s=st.one_of(st.none(), st.floats(min_value=0.5, max_value=60)),
    reserve_tokens=st.one_of(st.none(), st.integers(min_value=1, max_value=800)),
    reserve_s=st.one_of(st.none(), st.floats(min_value=0.1, max_value=20)),
    soft_thresholds=st.one_of(
        st.just((0.8, 0.95)),
        st.just(()),
        st.just((0.5,)),
        st.tuples(st.floats(0.1, 1.0), st.floats(0.1, 1.0)).map(tuple),
    ),
)
# one heartbeat: how far the clock moved, then what the run spent since the last one
_beat = st.tuples(
    st.floats(min_value=0, max_value=15),
    st.integers(min_value=0, max_value=3),  # steps
    st.integers(min_value=0, max_value=2),  # tool calls
    st.integers(min_value=0, max_value=900),  # tokens
)


@settings(
    max_examples=examples(250),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.lists(_limits, min_size=1, max_size=3), st.lists(_beat, max_size=12))
def test_heartbeat_decisions_equal_the_decide_path(limits: list[Limits], beats: list) -> None:
    clock = _Clock()
    sinks = (_Records(), _Records())
    regs = [Registry(PolicyConfig(), sink, guard_id="t", clock=clock) for sink in sinks]
    runs = [
        [
            reg.new_run(
                f"run-{i}",
                tenant="t1",
                agent="a",
                parent_run_id="",
                trace=b"\x01" * 16,
                started_at=0.0,
                limits=lim,
                session=None,
                admitted=True,
            )
            for i, lim in enumerate(limits)
        ]
        for reg in regs
    ]
    checks = (regs[0].check_deadline, lambda run: _old_check_deadline(regs[1], run))
    for dt, steps, tools, tokens in [(0.0, 0, 0, 0), *beats]:
        clock.now += dt
        for side in (0, 1):
            for run in runs[side]:
                for _ in range(steps):
                    run.budget.record_step()
                if tools:
                    run.budget.record_tool_calls(tools)
                if tokens:
                    run.budget.record_model_call(input_tokens=tokens)
                checks[side](run)
        assert sinks[0].decisions == sinks[1].decisions
        for new, old in zip(runs[0], runs[1], strict=True):
            assert (new.soft.rank, new.stop_reason) == (old.soft.rank, old.stop_reason)


@pytest.mark.parametrize("already", [0, 1, 2])
def test_a_deadline_fires_once_per_level_over_heartbeats(already: int) -> None:
    """The deadline's warn, wrap_up and cancel each reach the run once, in order, however
    many heartbeats pass, whichever level the run had already been given."""
    clock = _Clock()
    sink = _Records()
    reg = Registry(PolicyConfig(), sink, guard_id="t", clock=clock)
    run = reg.new_run(
        "r",
        tenant="t1",
        agent="a",
        parent_run_id="",
        trace=b"\x01" * 16,
        started_at=0.0,
        limits=Limits(deadline_s=10.0, soft_thresholds=(0.5, 0.8)),
        session=None,
        admitted=True,
    )
    for action in (Action.WARN, Action.WRAP_UP)[:already]:  # told before, by a span
        run.soft.advance(Decision(action))
    for _ in range(30):
        clock.now += 0.5
        reg.check_deadline(run)
    actions = [d[1] for d in sink.decisions]
    assert actions == ["warn", "wrap_up", "cancel"][already:]
    assert run.stop_reason is not None
