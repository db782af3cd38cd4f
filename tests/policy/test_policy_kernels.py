"""The policy's record kernels (``_speedups.c`` via ``_kernels``) against the methods they
stand in for, by hypothesis: twin objects, one driven through the kernels (and through the
method wherever a kernel refuses), one through the methods alone (and, for the loop
detector, one through its pure-Python reference), must stay equal; and a kernel that refuses
changes nothing."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from typing import Any

import pytest
from _hyp import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from guard.errors import BudgetExceeded
from guard.policy import Budget, Forecaster, Limits, LoopDetector, LoopSettings, Usage
from guard.policy._kernels import CONTINUE_VERDICT, record_kernels


def _fp(i: int) -> str:
    """A canonical fingerprint (32 hex digits) whose first 64 bits, what the detector's rings
    keep, are ``i``."""
    return f"{i:016x}{i:016x}"


KERNELS = record_kernels()
pytestmark = pytest.mark.skipif(KERNELS is None, reason="native paths not built")

COUNT = st.one_of(st.integers(0, 2000), st.sampled_from([-1, True, 2.0, 2**70, 10**12]))
COST = st.one_of(
    st.none(), st.floats(0, 1), st.sampled_from([0, 1, -0.5, math.nan, math.inf, 1e300])
)


def _budget_state(b: Budget, also: Usage) -> Any:
    lineage = (b, *b._ancestors)
    return [(dataclasses.asdict(x._usage), x._seq) for x in lineage], dataclasses.asdict(also)


def _add(u: Usage, inp: int, out: int, reasoning: int, cached: int, cost: Any) -> None:
    """What the span path adds to a request's tenant usage for one model call."""
    u.model_calls += 1
    u.input_tokens += inp
    u.output_tokens += out
    u.reasoning_tokens += reasoning
    u.cached_tokens += cached
    if cost is not None:
        u.cost_usd = (u.cost_usd or 0.0) + cost


def _record(b: Budget, inp: Any, out: Any, reasoning: Any, cached: Any, cost: Any) -> int:
    return b.record_model_call(
        input_tokens=inp,
        output_tokens=out,
        reasoning_tokens=reasoning,
        cached_tokens=cached,
        cost_usd=cost,
    )


def _twins(depth: int) -> tuple[tuple[Budget, Usage], tuple[Budget, Usage]]:
    out = []
    for _ in range(2):
        b = Budget(Limits())
        for _ in range(depth):
            b = Budget(Limits(), parent=b)
        out.append((b, Usage()))
    return out[0], out[1]


@settings(max_examples=examples(300), deadline=None)
@given(
    st.integers(0, 2),
    st.lists(
        st.one_of(
            st.tuples(st.just("step")),
            st.tuples(st.just("model"), COUNT, COUNT, COUNT, COUNT, COST),
            st.tuples(st.just("tools"), COUNT, COUNT),
        ),
        max_size=30,
    ),
)
def test_budget_kernels_match_the_methods(depth: int, ops: list[tuple[Any, ...]]) -> None:
    budget_step, budget_model_call = KERNELS.budget_step, KERNELS.budget_model_call
    (kb, ku), (mb, mu) = _twins(depth)
    for op in ops:
        before = _budget_state(kb, ku)
        if op[0] == "step":
            got = budget_step(kb, ku)
            assert got is not None
            assert got == mb.record_step()
            mu.steps += 1
            continue
        if op[0] == "tools":
            n, attempts = op[1:]
            got = KERNELS.budget_tool_calls(kb, ku, n, attempts)
            try:
                want = mb.record_tool_calls(n, attempts=attempts)
            except ValueError:
                assert got is None and _budget_state(kb, ku) == before
                continue
            if got is None:
                assert _budget_state(kb, ku) == before
                got = kb.record_tool_calls(n, attempts=attempts)
                ku.tool_calls += n
                ku.tool_attempts += attempts
            assert got == want
            mu.tool_calls += n
            mu.tool_attempts += attempts
            assert _budget_state(kb, ku) == _budget_state(mb, mu)
            continue
        inp, out, reasoning, cached, cost = op[1:]
        got = budget_model_call(kb, ku, inp, out, reasoning, cached, cost)
        try:
            want = _record(mb, inp, out, reasoning, cached, cost)
        except ValueError:
            assert got is None  # what the method refuses, the kernel leaves to it
            assert _budget_state(kb, ku) == before
            continue
        if got is None:  # refused: nothing changed; the method records it
            assert _budget_state(kb, ku) == before
            got = _record(kb, inp, out, reasoning, cached, cost)
            _add(ku, inp, out, reasoning, cached, cost)
        assert got == want
        _add(mu, inp, out, reasoning, cached, cost)
        assert _budget_state(kb, ku) == _budget_state(mb, mu)
    assert _budget_state(kb, ku) == _budget_state(mb, mu)


def test_a_budget_whose_lock_is_held_is_left_to_the_method() -> None:
    budget_step, budget_model_call = KERNELS.budget_step, KERNELS.budget_model_call
    b, also = Budget(Limits()), Usage()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with b._lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert held.wait(10)
        assert budget_step(b, also) is None
        assert budget_model_call(b, also, 1, 1, 0, 0, None) is None
    finally:
        release.set()
        t.join(10)
    assert b.usage() == Usage() and also == Usage() and b.seq == 0  # nothing was recorded
    assert budget_step(b, also) == 1 and b.usage().steps == 1 and also.steps == 1


FP = st.one_of(
    st.sampled_from([_fp(i) for i in (1, 2, 3, 4)]),
    st.integers(5, 60).map(_fp),  # new actions: same_result needs them
    st.sampled_from(["", "ab", "nothex-nothex-nothex", _fp(0), "-" + "1" * 20]),
)
# mostly one result, so that runs of equal results (same_result) are common
RESULT = st.one_of(st.just(_fp(9)), st.just(_fp(9)), st.none(), FP)


@settings(max_examples=examples(500), deadline=None)
@given(
    st.sampled_from([(6, 3, 3), (4, 2, 2), (20, 3, 8)]),
    st.lists(
        st.one_of(
            st.tuples(st.just("call"), FP, RESULT),
            st.tuples(
                st.just("step"),
                st.sampled_from([None, None, _fp(7), _fp(8), "xyz"]),
                st.sampled_from([True, True, False, None]),
                st.booleans(),
            ),
        ),
        max_size=80,
    ),
)
def test_loop_kernels_match_the_methods(shape: tuple[int, int, int], ops: list[Any]) -> None:
    loop_observe, loop_end_step, ok = KERNELS.loop_observe, KERNELS.loop_end_step, CONTINUE_VERDICT
    w, k, p = shape
    cfg = LoopSettings(window=w, repeat_threshold=k, no_progress_steps=p)
    kd, md, pd = LoopDetector(cfg), LoopDetector(cfg), LoopDetector(cfg)
    pd._native = None  # the pure-Python reference, filter and all

    def state(d: LoopDetector) -> Any:
        return (d._acts.tobytes(), d._res.tobytes(), d._n, d._stale, d._state, d._gbits,
                d._goff, d._base, d.hits)  # fmt: skip

    for op in ops:
        before = state(kd)
        if op[0] == "call":
            quiet = loop_observe(kd, op[1], op[2])
            if quiet is None:
                assert state(kd) == before
                got = kd.observe_action(op[1], op[2])
            else:
                got = ok if quiet else kd.judge_last()
            assert got == md.observe_action(op[1], op[2]) == pd.observe_action(op[1], op[2])
        else:
            _, st_, progress, acted = op
            got = loop_end_step(kd, st_, progress)
            if got is None:
                assert state(kd) == before
                got = kd.end_step(state=st_, progress=progress, acted=acted)
            assert got == md.end_step(state=st_, progress=progress, acted=acted)
            pd.end_step(state=st_, progress=progress, acted=acted)
        assert state(kd) == state(md) == state(pd)


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.integers(-2, 50), st.sampled_from([True, 2.0, 2**70, 10**12])),
            st.one_of(st.integers(-2, 10**6), st.sampled_from([True, 3.0, 2**70])),
        ),
        max_size=30,
    )
)
def test_forecast_kernel_matches_the_method(points: list[tuple[Any, Any]]) -> None:
    forecast_observe = KERNELS.forecast_observe
    kf, mf = Forecaster(), Forecaster()

    def state(f: Forecaster) -> Any:
        return repr((f._n, f._sx, f._sy, f._sxx, f._sxy, f._last))

    for index, tokens in points:
        before = state(kf)
        got = forecast_observe(kf, index, tokens)
        try:
            mf.observe(index, tokens)
        except ValueError:
            assert got is None and state(kf) == before
            continue
        if got is None:
            assert state(kf) == before
            kf.observe(index, tokens)
        assert state(kf) == state(mf)


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


LIMIT = st.one_of(st.none(), st.integers(0, 50))


@settings(max_examples=examples(400), deadline=None)
@given(
    st.fixed_dictionaries(
        {
            "max_steps": LIMIT,
            "max_tokens": st.one_of(st.none(), st.integers(0, 5000)),
            "reserve_tokens": st.sampled_from([0, 100, 1000]),
            "max_tool_calls": LIMIT,
            "max_model_calls": LIMIT,
            "max_cost_usd": st.one_of(st.none(), st.floats(0, 1)),
            "deadline_s": st.one_of(st.none(), st.floats(0, 100)),
            "reserve_s": st.sampled_from([0.0, 5.0]),
            "pause_freezes_deadline": st.booleans(),
        }
    ),
    st.lists(
        st.one_of(
            st.tuples(st.just("step")),
            st.tuples(st.just("model"), st.integers(0, 900), st.floats(0, 0.2)),
            st.tuples(st.just("tools"), st.integers(0, 4)),
            st.tuples(st.just("tick"), st.floats(0, 30)),
            st.tuples(st.just("pause")),
            st.tuples(st.just("resume")),
            st.tuples(st.just("reserve"), st.integers(0, 900)),
        ),
        max_size=25,
    ),
    st.integers(0, 3),
)
def test_budget_quiet_is_never_wrong(limits: dict[str, Any], ops: list[Any], rank: int) -> None:
    check_budget_quiet(limits, ops, rank)


def check_budget_quiet(limits: dict[str, Any], ops: list[Any], rank: int) -> None:
    """The differential comparison of the trigger check: after each op, a budget the kernel
    calls quiet gets no escalation from the method, in any phase; and with the budget's
    trigger points current for ``rank``, the kernel's check (``quiet_of`` in _kernels.h)
    answers as ``Escalations._quiet_locked`` does. Raises ``AssertionError`` where not."""
    from guard.policy import Action, Phase

    above = list(Action)[rank]
    clock = _Clock()
    b = Budget(Limits(**limits), clock=clock)
    for op in ops:
        if op[0] == "step":
            b.record_step()
        elif op[0] == "model":
            b.record_model_call(input_tokens=op[1], output_tokens=op[1] // 9, cost_usd=op[2])
        elif op[0] == "tools":
            b.record_tool_calls(op[1])
        elif op[0] == "tick":
            clock.t += op[1]
        elif op[0] in ("pause", "resume"):
            getattr(b, op[0])()
        else:
            with contextlib.suppress(BudgetExceeded):  # over budget: refused, nothing held
                b.reserve(tokens=op[1])
        quiet = KERNELS.budget_quiet(b, rank)
        assert quiet in (True, None)
        for phase in Phase:
            if quiet:
                assert b.escalation(phase=phase, above=above) is None
        # The check itself, both ways: the one above holds the kernel to decide(), which a
        # method that fires early (or late, short of decide()) would still pass.
        with b._lock:
            method = b._quiet_locked(rank)
        fresh = b._trig.limits is b._limits and b._trig.rank == rank
        kernel = KERNELS.budget_quiet(b, rank)
        if fresh:
            assert (kernel is True) == method, (op, kernel, method)
        else:  # other trigger points (rank 3 has none): the kernel leaves it to the method
            assert kernel is None, (op, kernel)


def test_budget_quiet_answers_for_a_budget_far_from_its_limits() -> None:
    from guard.policy import Action

    b = Budget(Limits(max_steps=100, max_tokens=10**6, deadline_s=3600.0), clock=_Clock())
    assert KERNELS.budget_quiet(b, 0) is True
    b.record_step()
    assert KERNELS.budget_quiet(b, 0) is True
    assert KERNELS.budget_quiet(b, 1) is None  # another rank's trigger points: the method's
    assert b.escalation(above=Action.WARN) is None
    assert KERNELS.budget_quiet(b, 1) is True
    b.set_limits(Limits(max_steps=1))
    assert KERNELS.budget_quiet(b, 1) is None  # other limits


# -- mutation check: the comparison above fails on a deliberately changed rule ----------------
def test_a_changed_trigger_threshold_is_caught_by_the_kernel_differential(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Escalations._quiet_locked`` with its steps trigger off by one (it fires a step early):
    check_budget_quiet agrees without the change and reports a disagreement with it."""
    from guard.policy import _escalation

    limits, ops = {"max_steps": 10}, [("step",)] * 7  # WARN at 7 steps (0.7 of 10)
    check_budget_quiet(limits, ops, 0)  # the control: the kernel and the method agree
    real = _escalation.Escalations._quiet_locked

    def one_step_early(self: Any, rank: int) -> bool:
        return real(self, rank) and not self._usage.steps + 1 >= self._trig.steps

    monkeypatch.setattr(_escalation.Escalations, "_quiet_locked", one_step_early)
    with pytest.raises(AssertionError, match=r"\('step',\), True, False"):
        check_budget_quiet(limits, ops, 0)  # at 6 steps: the kernel quiet, the method not
