"""Tenant allowances (pure accounting): grants never promise more than the windows have left."""

from __future__ import annotations

import contextlib

import pytest
from _hyp import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from guard.errors import InvalidInput
from guard.policy import RollingLimit, TenantAllowances, TenantBudget, TenantLimits, Usage

LIMIT = 1.0


def _ledger(limit: float = LIMIT, *, tokens: float | None = None):
    rolling = [RollingLimit("cost_usd", limit, 3600.0)]
    if tokens is not None:
        rolling.append(RollingLimit("tokens", tokens, 60.0))
    tb = TenantBudget("acme", TenantLimits(rolling=tuple(rolling)))
    return tb, TenantAllowances(tb, tail_s=5.0)


def test_admission_grants_nothing_and_a_request_exactly_its_need():
    _tb, led = _ledger()
    g = led.grant("r1", 0.0)
    assert g.max_cost_usd == 0.0 and g.max_tokens is None and not g.exhausted
    g = led.grant("r1", 0.0, need_cost_usd=0.2)
    assert g.max_cost_usd == pytest.approx(0.2)
    assert led.outstanding()[0] == pytest.approx(0.2)
    g = led.grant("r1", 0.0, need_cost_usd=0.01)  # the next call: on top of the first
    assert g.max_cost_usd == pytest.approx(0.21)


def test_a_need_that_does_not_fit_is_exhausted_and_changes_nothing():
    _tb, led = _ledger()
    led.grant("r1", 0.0, need_cost_usd=0.9)
    before = led.outstanding()
    g = led.grant("r2", 0.0, need_cost_usd=0.2)
    assert g.exhausted and "cost_usd needs 0.2 more" in g.detail and "0.1 left to grant" in g.detail
    assert "spent 0," in g.detail and "reserved by runs in flight 0.9)" in g.detail, g.detail
    assert led.outstanding() == before
    assert led.grant("r2", 0.0, need_cost_usd=0.1).max_cost_usd == pytest.approx(0.1)


def test_spend_moves_the_grant_into_the_window_and_release_gives_the_rest_back():
    tb, led = _ledger()
    led.grant("r1", 0.0, need_cost_usd=0.5)
    tb.record(0.0, Usage(cost_usd=0.3))
    led.observe("r1", 0.3, 0.0)
    assert led.outstanding()[0] == pytest.approx(0.2)
    led.release("r1", 1.0)  # no final usage known (agent_lost): everything back
    assert led.outstanding()[0] == 0.0 and "r1" not in led


def test_release_keeps_the_tail_the_final_usage_announces_until_late_spans_or_time():
    _tb, led = _ledger()
    led.grant("r1", 0.0, need_cost_usd=0.5)
    led.observe("r1", 0.3, 0.0)
    led.release("r1", 1.0, final=(0.4, 0.0))  # 0.1 still on its way
    assert led.outstanding()[0] == pytest.approx(0.1)
    led.spend_late("r1", 0.1, 0.0)
    assert led.outstanding()[0] == pytest.approx(0.0) and "r1" not in led
    led.grant("r2", 1.0, need_cost_usd=0.5)
    led.observe("r2", 0.1, 0.0)
    led.release("r2", 2.0, final=(0.2, 0.0))
    led.expire(6.9)
    assert led.outstanding()[0] == pytest.approx(0.1)
    led.expire(7.0)
    assert led.outstanding()[0] == 0.0


def test_a_restored_run_is_granted_above_what_it_already_spent():
    _tb, led = _ledger()
    g = led.grant("r1", 0.0, seen=(0.4, 0.0))
    assert g.max_cost_usd == pytest.approx(0.4)
    g = led.grant("r1", 0.0, need_cost_usd=0.05)
    assert g.max_cost_usd == pytest.approx(0.45)
    assert led.outstanding()[0] == pytest.approx(0.05)


def test_amounts_must_be_finite():
    _tb, led = _ledger()
    with pytest.raises(InvalidInput):
        led.grant("r1", 0.0, need_cost_usd=float("nan"))
    with pytest.raises(InvalidInput):
        led.observe("r1", float("inf"), 0.0)


_ops = st.lists(
    st.tuples(
        st.sampled_from(["grant", "spend", "release", "late", "tick", "reserve"]),
        st.integers(0, 5),  # run
        st.floats(0.0, 0.6, allow_nan=False),  # amount
        st.booleans(),  # within the grant / with a final usage
    ),
    max_size=60,
)


@settings(max_examples=examples(300), deadline=None)
@given(_ops)
def test_no_sequence_lets_outstanding_grants_plus_the_window_pass_the_limit(ops):
    """window used + held + outstanding grants <= limit + the spend made beyond grants."""
    tb, led = _ledger(tokens=1000.0)
    now = 0.0
    spent: dict[int, float] = {}  # cumulative usage per run, as the windows saw it
    excess = 0.0  # usage beyond what the run had outstanding when spent (not the ledger's)
    held = []
    for op, r, amount, flag in ops:
        rid = f"r{r}"
        if op == "grant":
            led.grant(rid, now, need_cost_usd=amount, need_tokens=amount * 100)
        elif op == "spend":
            g = led.grant_of(rid)
            out = 0.0 if g is None else max(0.0, g.max_cost_usd - spent.get(r, 0.0))
            x = min(amount, out) if flag else amount
            excess += max(0.0, x - out)
            spent[r] = spent.get(r, 0.0) + x
            tb.record(now, Usage(cost_usd=x))
            led.observe(rid, spent[r], 0.0)
        elif op == "release":
            final = (spent.get(r, 0.0) + amount, 0.0) if flag else None
            led.release(rid, now, final=final)
        elif op == "late":
            tb.record(now, Usage(cost_usd=amount))
            g = led.grant_of(rid)
            out = 0.0 if g is None else max(0.0, g.max_cost_usd - spent.get(r, 0.0))
            excess += max(0.0, amount - out)
            spent[r] = spent.get(r, 0.0) + amount
            led.spend_late(rid, amount, 0.0)
        elif op == "reserve":
            with contextlib.suppress(Exception):
                held.append(tb.reserve(now, cost_usd=amount / 4))
        else:
            now += 2.0
            led.expire(now)
        (window, *_), *_ = [s[2:] for s in tb.status(now) if s[0] == "cost_usd"]
        assert window + led.outstanding()[0] <= LIMIT + excess + 1e-9, (window, led.outstanding())
        assert led.outstanding()[1] <= 1000.0 + 1e-9


def test_new_runs_are_denied_while_less_is_left_than_a_run_was_refused():
    tb, led = _ledger()
    assert not tb.admit(0.0).stop
    led.grant("r1", 0.0, need_cost_usd=0.95)
    assert not tb.admit(0.0).stop  # nobody was refused yet
    assert led.grant("r2", 0.0, need_cost_usd=0.1).exhausted
    d = tb.admit(0.0)
    assert d.stop and d.reason == "tenant_budget" and d.metric == "cost_usd"
    assert "0.05 left to grant, less than the 0.1 a run last needed" in d.message, d.message
    led.release("r1", 1.0)  # its grant comes back: room again
    assert not tb.admit(1.0).stop


def test_an_idle_run_holds_nothing_so_a_busy_one_is_refused_only_at_the_limit():
    """Many runs admitted at once hold nothing: the last call that fits is granted, whoever
    asks for it, and the refusal after it names the spend and the reservations in flight."""
    tb, led = _ledger(limit=0.5)
    for n in range(32):
        led.grant(f"r{n}", 0.0)
    for k in range(49):  # 49 calls of r0, spent and seen
        assert not led.grant("r0", 0.0, need_cost_usd=0.01).exhausted
        tb.record(0.0, Usage(cost_usd=0.01))
        led.observe("r0", 0.01 * (k + 1), 0.0)
    assert not led.grant("r31", 0.0, need_cost_usd=0.01).exhausted  # the 50th: in flight
    g = led.grant("r7", 0.0, need_cost_usd=0.01)
    assert g.exhausted, g
    assert "spent 0.49," in g.detail and "reserved by runs in flight 0.01)" in g.detail, g.detail


class _ScanningLedger(TenantAllowances):
    """The reference expiry: scan every entry for tails whose time is up (the code before
    the tails were kept in a heap)."""

    def _expire_locked(self, now: float) -> None:
        gone = [
            rid
            for rid, e in self._entries.items()
            if e.expires_at is not None and e.expires_at <= now
        ]
        for rid in gone:
            self._drop_locked(rid)


_ops = st.lists(
    st.tuples(
        st.sampled_from(["grant", "observe", "release", "release_final", "expire"]),
        st.integers(0, 5),  # run
        st.floats(0, 20),  # now: not always increasing (callers' clocks may differ)
        st.floats(0, 0.3),  # an amount
    ),
    max_size=60,
)


@settings(max_examples=examples(300), deadline=None)
@given(_ops)
def test_tails_expire_exactly_as_a_scan_of_every_entry(ops):
    """The heap of tails gives back what the scan gave back, at the same calls, whatever the
    order of release times and clocks."""
    tb1 = TenantBudget("acme", TenantLimits(rolling=(RollingLimit("cost_usd", LIMIT, 3600.0),)))
    tb2 = TenantBudget("acme", TenantLimits(rolling=(RollingLimit("cost_usd", LIMIT, 3600.0),)))
    fast, ref = TenantAllowances(tb1, tail_s=5.0), _ScanningLedger(tb2, tail_s=5.0)
    for op, run, now, amount in ops:
        rid = f"r{run}"
        for led in (fast, ref):
            if op == "grant":
                led.grant(rid, now, need_cost_usd=amount)
            elif op == "observe":
                led.observe(rid, amount, 0.0)
            elif op == "release":
                led.release(rid, now)
            elif op == "release_final":
                led.release(rid, now, final=(amount * 2, 0.0))
            else:
                led.expire(now)
        assert fast.outstanding() == pytest.approx(ref.outstanding(), abs=1e-9)
        assert sorted(fast._entries) == sorted(ref._entries)
