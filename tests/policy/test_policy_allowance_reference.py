"""The tenant allowances' ledger (``TenantAllowances``, written with few calls for the guard's
control path) against a plain reference of the same rules (the methods written with few
calls, written plainly in a subclass): for any sequence of grants, spends, late spends,
releases, expiries, reservations, window spend and policy reloads, both give the same answers
and hold the same state, bit for bit (the same float operations in the same order), and
refuse the same inputs with the same words."""

from __future__ import annotations

import heapq
import math
from typing import Any

from _hyp import examples
from hypothesis import example, given, settings
from hypothesis import strategies as st

from guard.errors import BudgetExceeded, InvalidInput
from guard.policy import RollingLimit, TenantAllowances, TenantBudget, TenantLimits, Usage
from guard.policy._allowance import (
    ALLOWANCE_METRICS,
    AllowanceGrant,
    _Entry,
    _finite,
    short_of_grant,
)

_EPS = 1e-12


class ReferenceAllowances(TenantAllowances):
    """``TenantAllowances`` with the methods that changed as they were (the reference); the
    others (reading, ``observe_many``, ``spend_late``, expiry) are inherited unchanged."""

    # -- grants -----------------------------------------------------------------------------
    def grant(
        self,
        run_id: str,
        now: float,
        *,
        need_cost_usd: float = 0.0,
        need_tokens: float = 0.0,
        seen: tuple[float, float] = (0.0, 0.0),
    ) -> AllowanceGrant:
        need = [_finite(need_cost_usd), _finite(need_tokens)]
        with self._lock:
            self._expire_locked(now)
            e = self._entries.get(run_id)
            if e is None:
                e = self._entries[run_id] = _Entry([_finite(seen[0]), _finite(seen[1])])
            if e.expires_at is not None:  # ended: nothing more for it
                return self._grant_locked(run_id, e)
            head = self.budget._headroom_locked(now)
            limits = self._limits()
            add = [0.0, 0.0]
            for i, h in enumerate(head):
                if h is None:
                    continue
                available = max(0.0, h - self._out[i])
                if need[i] > available + _EPS:
                    self.budget._refused[i] = need[i]  # new runs are denied meanwhile
                    metric = ALLOWANCE_METRICS[i]
                    return AllowanceGrant(
                        run_id,
                        *self._ceilings_locked(e),
                        exhausted=True,
                        detail=short_of_grant(
                            self.budget.tenant,
                            metric,
                            need[i],
                            available,
                            limits[i],
                            limits[i] - h,
                            self._out[i],
                        ),
                    )
                add[i] = min(available, need[i])
            for i in range(2):
                if add[i] > 0.0:
                    before = e.outstanding(i)
                    e.ceiling[i] = max(e.ceiling[i], e.seen[i]) + add[i]
                    self._out[i] += e.outstanding(i) - before
            return self._grant_locked(run_id, e)

    def _limits(self) -> list[float]:
        out = [math.inf, math.inf]
        for r in self.budget.limits.rolling:
            if r.metric in ALLOWANCE_METRICS:
                i = ALLOWANCE_METRICS.index(r.metric)
                out[i] = min(out[i], r.limit)
        return out

    def _ceilings_locked(self, e: _Entry) -> tuple[float | None, float | None]:
        has = [False, False]
        for r in self.budget.limits.rolling:
            if r.metric in ALLOWANCE_METRICS:
                has[ALLOWANCE_METRICS.index(r.metric)] = True
        return (
            e.ceiling[0] if has[0] else None,
            e.ceiling[1] if has[1] else None,
        )

    def _grant_locked(self, run_id: str, e: _Entry) -> AllowanceGrant:
        return AllowanceGrant(run_id, *self._ceilings_locked(e))

    # -- spending and releasing ---------------------------------------------------------------
    def observe(self, run_id: str, cost_usd: float, tokens: float) -> None:
        v = [_finite(cost_usd), _finite(tokens)]
        with self._lock:
            e = self._entries.get(run_id)
            if e is not None:
                self._set_seen_locked(e, v, cumulative=True)

    def _set_seen_locked(self, e: _Entry, v: list[float], *, cumulative: bool) -> None:
        for i in range(2):
            before = e.outstanding(i)
            e.seen[i] = max(e.seen[i], v[i]) if cumulative else e.seen[i] + v[i]
            self._out[i] += e.outstanding(i) - before
            if abs(self._out[i]) < 1e-9:
                self._out[i] = max(0.0, self._out[i])

    def release(self, run_id: str, now: float, *, final: tuple[float, float] | None = None) -> None:
        with self._lock:
            e = self._entries.get(run_id)
            if e is None or e.expires_at is not None:
                return
            if final is None:
                self._drop_locked(run_id)
                return
            for i in range(2):
                before = e.outstanding(i)
                e.ceiling[i] = min(e.ceiling[i], max(e.seen[i], _finite(final[i])))
                self._out[i] += e.outstanding(i) - before
            if all(e.outstanding(i) <= _EPS for i in range(2)):
                self._drop_locked(run_id)
            else:
                e.expires_at = now + self.tail_s
                heapq.heappush(self._tails, (e.expires_at, run_id))

    def _drop_locked(self, run_id: str) -> None:
        e = self._entries.pop(run_id, None)
        if e is not None:
            for i in range(2):
                self._out[i] = max(0.0, self._out[i] - e.outstanding(i))


_SHAPES = [
    (("cost_usd", 1.0, 3600.0),),
    (("cost_usd", 1.0, 3600.0), ("tokens", 1000.0, 60.0)),
    (("tokens", 500.0, 60.0), ("runs", 10.0, 60.0)),
    (("cost_usd", 2.0, 3600.0), ("cost_usd", 0.7, 60.0), ("tokens", 1e6, 60.0)),
    (("steps", 100.0, 60.0),),  # nothing an allowance can be cut from
]
_AMOUNT = st.one_of(
    # decimals whose float sums drift (0.1 + 0.2 != 0.3): the ledger's clamps near zero
    st.sampled_from([0.0, 0.1, 0.2, 0.3, 0.7, 1 / 3, 0.05, 0.15, 1.0]),
    st.floats(0.0, 1.2),
    st.sampled_from([-0.0, 1e-12, 1e-9, 1e300]),
    st.sampled_from([-1e-9, math.nan, math.inf]),  # refused by both
)
# whole seconds, so a tail's expiry (release + 5 s) meets ``now`` exactly; not always
# increasing: callers' clocks differ
_TIME = st.one_of(st.integers(0, 40).map(float), st.floats(0.0, 200.0))
_OPS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "grant",
                "grant",
                "grant_new",
                "observe",
                "observe_many",
                "late",
                "release",
                "release_final",
                "expire",
                "record",
                "reserve",
                "reload",
                "admit",
            ]
        ),
        st.integers(0, 5),  # the run
        _TIME,
        _AMOUNT,
        _AMOUNT,
        _AMOUNT,
    ),
    max_size=80,
)


def _answer(fn, *args, **kw) -> Any:
    try:
        out = fn(*args, **kw)
    except (InvalidInput, BudgetExceeded) as exc:
        return ("raised", type(exc).__name__, str(exc))
    return tuple(out) if isinstance(out, tuple) else ("done", out is None)


def _state(led: Any) -> Any:
    entries = {
        rid: (tuple(e.seen), tuple(e.ceiling), e.expires_at) for rid, e in led._entries.items()
    }
    tb = led.budget
    return (
        entries,
        tuple(led._out),
        sorted(led._tails),
        tuple(tb._refused),
        tb.live_runs,
        tuple(tb._held.values()),
    )


def _apply(led: Any, ref: bool, op: tuple, shapes: list) -> Any:
    name, run, now, a, b, c = op
    rid = f"r{run}"
    tb = led.budget
    if name == "grant":
        return _answer(led.grant, rid, now, need_cost_usd=a, need_tokens=b * 1000)
    if name == "grant_new":  # a re-registered run's first grant, above what it spent
        return _answer(led.grant, rid, now, seen=(a, b * 1000))
    if name == "observe":
        return _answer(led.observe, rid, a, b * 1000)
    if name == "observe_many":
        items = [(f"r{k}", abs(a) * k, abs(b) * 100 * k) for k in range(4)]
        items = [i for i in items if all(math.isfinite(x) for x in i[1:])]
        return _answer(led.observe_many, items)
    if name == "late":
        return _answer(led.spend_late, rid, a, b * 1000)
    if name in ("release", "release_final"):
        final = (c, a * 1000) if name == "release_final" else None  # above or below seen
        seen = (a, b * 1000) if run % 2 else None
        if not ref:
            return _answer(led.release, rid, now, final=final, seen=seen)
        if seen is not None:  # what the guard did before release took ``seen``
            got = _answer(led.observe, rid, *seen)
            if got[0] == "raised":
                return got
        return _answer(led.release, rid, now, final=final)
    if name == "expire":
        return _answer(led.expire, now)
    if name == "record":
        if not (math.isfinite(a) and math.isfinite(b)):
            return None
        usage = Usage(input_tokens=int(abs(b) * 300), cost_usd=abs(a) / 3)
        return _answer(lambda: tb.record(now, usage).message)
    if name == "reserve":
        if not (math.isfinite(a) and a >= 0 and math.isfinite(b)):
            return None
        return _answer(lambda: tb.reserve(now, cost_usd=a / 4, tokens=int(b * 100)) and None)
    if name == "admit":
        return _answer(lambda: tb.admit(now).message)
    # a policy reload: the budget gets other limits (the ledger must read them again)
    shape = shapes[run % len(shapes)]
    tb.set_limits(TenantLimits(rolling=tuple(RollingLimit(*r) for r in shape)))
    return None


@settings(max_examples=examples(400), deadline=None)
# a tail that falls due exactly when a grant comes (release at 3 s + tail_s = 8 s)
@example(
    0,
    [
        ("grant", 0, 0.0, 0.1, 0.0, 0.0),
        ("release_final", 0, 3.0, 0.0, 0.0, 0.05),
        ("grant", 1, 8.0, 0.1, 0.0, 0.0),
    ],
)
# a final usage below what the guard saw (cost), while the tokens keep a tail
@example(
    1,
    [
        ("grant", 1, 0.0, 0.2, 0.2, 0.0),
        ("release_final", 1, 1.0, 0.3, 0.1, 0.1),
        ("grant_new", 1, 2.0, 0.0, 0.0, 0.0),
    ],
)
@given(
    st.sampled_from(range(len(_SHAPES))),
    _OPS,
)
def test_the_ledger_equals_the_reference_for_any_sequence(shape, ops):
    def build(cls):
        limits = TenantLimits(rolling=tuple(RollingLimit(*r) for r in _SHAPES[shape]))
        return cls(TenantBudget("acme", limits), tail_s=5.0)

    fast, ref = build(TenantAllowances), build(ReferenceAllowances)
    assert fast.tracked() == ref.tracked()
    for op in ops:
        got, want = _apply(fast, False, op, _SHAPES), _apply(ref, True, op, _SHAPES)
        assert got == want, (op, got, want)
        assert _state(fast) == _state(ref), op
        assert fast.outstanding() == ref.outstanding()
        for k in range(6):
            g, w = fast.grant_of(f"r{k}"), ref.grant_of(f"r{k}")
            assert (None if g is None else tuple(g)) == (None if w is None else tuple(w))
