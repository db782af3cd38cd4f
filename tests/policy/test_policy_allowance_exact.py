"""A tenant budget is exact at both ends, for any interleaving of what agents and the guard do.

Agents are modelled as the SDK behaves: a call asks the guard for what its estimate needs
beyond the run's ceiling, then runs; it finishes (settles) at an actual cost that may differ
from the estimate; its span reaches the guard later (or after the run ended); a run ends
with its final usage; time passes and tails expire. Over every sequence:

* never more is spent than the limit plus what calls spent beyond their own estimates;
* a refusal only comes when what is spent, plus what calls in flight reserved, plus what the
  estimates' errors left with the runs, leaves less than the request: nothing lent ahead of
  a need, no spend counted twice, no ended run's allowance kept past its tail.
"""

from __future__ import annotations

from _hyp import examples
from hypothesis import example, given, settings
from hypothesis import strategies as st

from guard.policy import RollingLimit, TenantAllowances, TenantBudget, TenantLimits, Usage

LIMIT = 0.5
EPS = 1e-9


class _Agent:
    def __init__(self) -> None:
        self.used = 0.0  # what its finished calls cost (as the agent counts it)
        self.inflight: list[float] = []  # the estimates of its calls in flight
        self.delivered = 0.0  # what of ``used`` the guard has seen
        self.error = 0.0  # estimate - actual, summed over its settled calls (>= 0 part)
        self.ceiling = 0.0
        self.ended = False

    @property
    def held(self) -> float:
        return self.used + sum(self.inflight)


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["call", "call", "call", "finish", "deliver", "end", "tick"]),
        st.integers(0, 7),  # the run
        st.sampled_from([0.01, 0.012, 0.03, 0.1]),  # an estimate
        st.sampled_from([0.5, 0.8, 1.0, 1.0, 1.2]),  # actual / estimate
    ),
    max_size=120,
)


@settings(max_examples=examples(400), deadline=None)
@example(  # the window lent out to idle runs at their admission (the old chunks)
    [("call", r, 0.01, 1.0) for r in range(8)] + [("call", 0, 0.01, 1.0)] * 30
)
@given(_OPS)
def test_never_over_the_limit_and_never_refused_while_money_is_left(ops):
    tb = TenantBudget("acme", TenantLimits(rolling=(RollingLimit("cost_usd", LIMIT, 3600.0),)))
    led = TenantAllowances(tb, tail_s=5.0)
    agents = [_Agent() for _ in range(8)]
    now, excess = 0.0, 0.0
    for n, a in enumerate(agents):
        a.ceiling = led.grant(f"r{n}", now).max_cost_usd or 0.0  # admitted: nothing lent
    for op, r, est, factor in ops:
        a, rid = agents[r], f"r{r}"
        if op == "call" and not a.ended:
            need = a.held + est - a.ceiling
            if need > 1e-12:
                g = led.grant(rid, now, need_cost_usd=need, seen=(a.delivered, 0.0))
                if g.exhausted:
                    committed = sum(  # spent + in flight + what estimates left with live runs
                        x.held + (0.0 if x.ended else min(x.error, max(0.0, x.ceiling - x.held)))
                        for x in agents
                    )
                    assert LIMIT - committed < need + EPS, (g.detail, committed, need)
                    continue
                a.ceiling = g.max_cost_usd
            a.inflight.append(est)
        elif op == "finish" and a.inflight:
            e = a.inflight.pop(0)
            actual = e * factor
            a.used += actual
            a.error += max(0.0, e - actual)
            excess += max(0.0, actual - e)
        elif op == "deliver" and a.delivered < a.used:
            tb.record(now, Usage(cost_usd=a.used - a.delivered))
            if a.ended:
                led.spend_late(rid, a.used - a.delivered, 0.0)
            else:
                led.observe(rid, a.used, 0.0)
            a.delivered = a.used
        elif op == "end" and not a.ended:
            for e in a.inflight:  # its calls finish as estimated before it ends
                a.used += e
            a.inflight.clear()
            a.ended = True
            led.release(rid, now, final=(a.used, 0.0), seen=(a.delivered, 0.0))
        elif op == "tick":
            for x, xid in zip(agents, (f"r{k}" for k in range(8)), strict=True):
                if x.ended and x.delivered < x.used:  # late spans arrive within the tail
                    tb.record(now, Usage(cost_usd=x.used - x.delivered))
                    led.spend_late(xid, x.used - x.delivered, 0.0)
                    x.delivered = x.used
            now += 3.0
            led.expire(now)
        spent = sum(x.used + sum(x.inflight) for x in agents)
        assert spent <= LIMIT + excess + EPS, (spent, excess)
