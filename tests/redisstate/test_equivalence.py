"""The Redis tenant budgets read like the in-memory reference and a test holds the two equal.

The same random sequence of admit / run_ended / record+observe / grant / release / late spend
/ expire / time steps goes to the policy's ``TenantBudget`` + ``TenantAllowances`` and to
``RedisTenantBudgets`` on a real redis-server (same virtual clock); every decision, grant and
status must agree (floats within 1e-9).

:func:`run_both` is that comparison (it raises ``AssertionError`` at the first disagreement).
The mutation checks at the end change the policy's rule (its window, its allowance) and show
that the same comparison then fails, and passes on the same ops without the change: the Lua
copy is held to its home by a test that notices a changed rule.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from array import array
from typing import Any

import pytest
from _hyp import examples
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from guard.policy import (
    RollingLimit,
    RollingWindow,
    TenantAllowances,
    TenantBudget,
    TenantLimits,
    Usage,
    _rolling,
)
from guard.server._redis import RedisTenantBudgets, StateClient

LIMITS = TenantLimits(
    max_concurrent_runs=2,
    rolling=(
        RollingLimit("cost_usd", 1.0, 60.0),
        RollingLimit("tokens", 1000.0, 120.0),
        RollingLimit("runs", 6.0, 60.0),
        RollingLimit("steps", 40.0, 30.0),
    ),
)
BUCKETS = 6
RUNS = [f"r{i}" for i in range(6)]
_names = itertools.count()

cents = st.integers(0, 40).map(lambda c: c / 100)  # exact-ish spends, so limits are hit exactly
admit = st.tuples(st.just("admit"), st.sampled_from(RUNS))
op = st.one_of(
    admit,
    admit,
    st.tuples(st.just("end"), st.sampled_from(RUNS)),
    st.tuples(
        st.just("record"),
        cents,
        st.integers(0, 300),
        st.integers(0, 5),
        st.lists(st.tuples(st.sampled_from(RUNS), cents, st.integers(0, 300)), max_size=3),
    ),
    st.tuples(st.just("grant"), st.sampled_from(RUNS), cents, st.integers(0, 200)),
    st.tuples(
        st.just("release"),
        st.sampled_from(RUNS),
        st.none() | st.tuples(cents, st.integers(0, 300)),
    ),
    st.tuples(st.just("late"), st.sampled_from(RUNS), cents, st.integers(0, 100)),
    st.tuples(st.just("expire")),
    st.tuples(st.just("tick"), st.floats(0.0, 40.0)),
)


def close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def same_decision(ref, got) -> None:
    assert (ref.action, ref.reason, ref.metric) == (got.action, got.reason, got.metric)
    assert close(ref.utilisation, got.utilisation)
    if ref.message != got.message:  # the numbers in it may differ in the last float digit
        assert ref.message.split(" ")[:3] == got.message.split(" ")[:3], (ref, got)


def same_grant(ref, got) -> None:
    assert ref.run_id == got.run_id and ref.exhausted == got.exhausted, (ref, got)
    assert close(ref.max_cost_usd, got.max_cost_usd), (ref, got)
    assert close(ref.max_tokens, got.max_tokens), (ref, got)
    assert ref.detail.split(",")[0] == got.detail.split(",")[0], (ref, got)


async def run_both(url: str, ops: list[tuple], t0: float) -> None:
    """The differential comparison: ``ops`` from ``t0`` to the reference and to Redis; raises
    ``AssertionError`` at the first decision, grant or status on which they differ."""
    now = [t0]
    tenant = f"eq{next(_names)}"
    budget = TenantBudget(tenant, LIMITS, buckets=BUCKETS)
    ledger = TenantAllowances(budget, tail_s=5.0)
    client = StateClient(url, socket_timeout_ms=10_000)  # the suite shares 2 cores
    red = RedisTenantBudgets(
        client,
        lambda t: LIMITS,
        tail_s=5.0,
        lease_s=1e9,
        buckets=BUCKETS,
        clock=lambda: now[0],
    )
    admitted: set[str] = set()
    seen = {r: [0.0, 0.0] for r in RUNS}
    try:
        for o in ops:
            kind = o[0]
            if kind == "admit" and o[1] not in admitted:
                ref = budget.admit(now[0])
                same_decision(ref, await red.admit(tenant, o[1]))
                if not ref.stop:
                    admitted.add(o[1])
            elif kind == "end" and o[1] in admitted:
                admitted.discard(o[1])
                budget.run_ended()
                await red.run_ended(tenant, o[1])
            elif kind == "record":
                _, cost, tokens, steps, obs = o
                u = Usage(steps=steps, input_tokens=tokens, cost_usd=cost)
                observe = []
                for rid, c, t in obs:  # cumulative usage only grows
                    seen[rid][0] += c
                    seen[rid][1] += t
                    observe.append((rid, seen[rid][0], seen[rid][1]))
                ref = budget.record(now[0], u)
                for rid, c, t in observe:
                    ledger.observe(rid, c, t)
                same_decision(ref, await red.record(tenant, u, observe=observe))
            elif kind == "grant":
                _, rid, need_c, need_t = o
                kw = {"need_cost_usd": need_c, "need_tokens": need_t, "seen": tuple(seen[rid])}
                ref = ledger.grant(rid, now[0], **kw)
                same_grant(ref, await red.grant(tenant, rid, **kw))
            elif kind == "release":
                _, rid, final = o
                s = tuple(seen[rid])
                ledger.observe(rid, *s)
                ledger.release(rid, now[0], final=final)
                await red.release(tenant, rid, final=final, seen=s)
            elif kind == "late":
                _, rid, c, t = o
                ledger.spend_late(rid, c, t)
                await red.record(tenant, late=[(rid, c, t)])
            elif kind == "expire":
                ledger.expire(now[0])
                await red.expire(tenant)
            elif kind == "tick":
                now[0] += o[1]
            st_ = await red.status(tenant)
            assert st_.live_runs == budget.live_runs
            for (m, w, used, lim), (m2, w2, used2, lim2) in zip(
                budget.status(now[0]), st_.windows, strict=True
            ):
                assert (m, w, lim) == (m2, w2, lim2) and close(used, used2), (m, used, used2)
            assert all(map(close, ledger.outstanding(), st_.outstanding)), st_
            hit = budget.exhausted(now[0])
            assert (hit is None) == (st_.exhausted is None) and (
                hit is None or hit[0] == st_.exhausted[0]
            )
            for rid in RUNS:
                g = ledger.grant_of(rid)
                g2 = await red.grant_of(tenant, rid)
                assert (g is None) == (g2 is None)
                if g is not None:
                    same_grant(g, g2)
    finally:
        await client.aclose()


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(op, min_size=1, max_size=50), t0=st.floats(0.0, 1e6))
@example(  # a refused need denies new runs while what is left stays below it
    ops=[
        ("admit", "r0"),
        ("record", 0.4, 0, 0, []),
        ("record", 0.4, 0, 0, []),
        ("grant", "r0", 0.3, 0),
        ("admit", "r1"),
    ],
    t0=0.0,
)
@example(  # late spend settles a tail: the entry goes
    ops=[
        ("admit", "r0"),
        ("grant", "r0", 0.2, 0),
        ("release", "r0", (0.1, 0)),
        ("late", "r0", 0.1, 0),
    ],
    t0=0.0,
)
@example(ops=[("admit", f"r{i}") for i in range(4)], t0=5.0)  # the concurrency cap
@example(  # one run twice in one request
    ops=[("grant", "r0", 0.0, 0), ("record", 0.0, 0, 0, [("r0", 0.0, 1), ("r0", 0.0, 234)])],
    t0=0.0,
)
def test_redis_budgets_equal_the_in_memory_reference(redis_server, ops, t0):
    asyncio.run(run_both(redis_server.url, ops, t0))


# -- mutation checks: the comparison above fails on a deliberately changed rule ---------------
# Each changes the Python home of a rule (monkeypatch: undone after the test) and replays one
# explicit op list through run_both: it agrees without the change (the control) and reports a
# disagreement with it, so the Lua script would not go on agreeing with a changed rule either.


def _counts_usage_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """A window that counts every recorded spend twice."""
    real = _rolling._metric_value
    monkeypatch.setattr(_rolling, "_metric_value", lambda m, d: 2 * real(m, d))


class _EarlyWindow(RollingWindow):
    """A window whose oldest bucket expires one bucket early: the same bucket width, one
    bucket fewer kept."""

    def __init__(self, window_s: float, *, buckets: int = 60) -> None:
        super().__init__(window_s, buckets=buckets)
        self.buckets = buckets - 1
        self._sums = array("d", bytes(8 * self.buckets))
        self._ids = array("q", [-(2**62)] * self.buckets)


def _expires_a_bucket_early(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_rolling, "RollingWindow", _EarlyWindow)


def _grants_ten_percent_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """An allowance that grants 10% more than the need it is asked for."""
    real = TenantAllowances.grant

    def grant(self: TenantAllowances, run_id: str, now: float, **kw: Any) -> Any:
        for k in ("need_cost_usd", "need_tokens"):
            kw[k] = kw.get(k, 0.0) * 1.1
        return real(self, run_id, now, **kw)

    monkeypatch.setattr(TenantAllowances, "grant", grant)


def _caught(url: str, mutate: Any, ops: list[tuple], monkeypatch: pytest.MonkeyPatch) -> str:
    """Replays ``ops`` through run_both as is (they must agree), then with the rule changed by
    ``mutate``: the disagreement run_both reports (it must report one)."""
    asyncio.run(run_both(url, ops, 0.0))  # the control: the rules agree
    mutate(monkeypatch)
    with pytest.raises(AssertionError) as caught:
        asyncio.run(run_both(url, ops, 0.0))
    return str(caught.value)


_WINDOW_MUTATIONS = {
    # one spend of 0.1: the cost window reads 0.2 on the mutated side
    "counts_usage_twice": (_counts_usage_twice, [("record", 0.1, 0, 0, [])]),
    # a spend, then 55 s of a 60 s window of 10 s buckets: 5 buckets later it is still in
    "expires_a_bucket_early": (
        _expires_a_bucket_early,
        [("record", 0.1, 0, 0, []), ("tick", 55.0)],
    ),
}


@pytest.mark.parametrize("mutation", sorted(_WINDOW_MUTATIONS))
def test_a_changed_window_rule_is_caught_by_the_lua_differential(
    redis_server, monkeypatch: pytest.MonkeyPatch, mutation: str
) -> None:
    mutate, ops = _WINDOW_MUTATIONS[mutation]
    assert "cost_usd" in _caught(redis_server.url, mutate, ops, monkeypatch)  # the window's


def test_a_changed_allowance_rule_is_caught_by_the_lua_differential(
    redis_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    ops = [("admit", "r0"), ("grant", "r0", 0.2, 0)]  # a run asks for 0.2: 0.22 on one side
    assert "0.22" in _caught(redis_server.url, _grants_ten_percent_more, ops, monkeypatch)
