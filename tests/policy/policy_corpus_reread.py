"""Mixed traces: the same lookup re-read alongside new work (see policy_corpus.py).

An agent that re-reads the same refund policy for each new customer repeats one call with one
result, but between two reads it does new work (a lookup with a result never seen before) and
its facts grow (the state hash changes, or it reports ``progress=True``): that is not a loop.
The near misses below ARE loops: re-reading with no new facts, re-reading between lookups
that bring nothing new (a frozen state, forged growing facts), several reads within one step,
cycles whose facts are claimed to grow, and a run that makes progress and then gets stuck
(``loop_start`` is the step where the looping began, for the delay figure).

Every trace is tagged ``reread``; ``benchmarks/loop_corpus.py`` reports them apart as well.
"""

from __future__ import annotations

from policy_corpus_base import Step, Trace
from policy_corpus_base import step as _s

__all__ = ["REREAD_LEGIT", "REREAD_LOOPS"]

_TAG = ("reread",)
_POLICY = ("read_policy", {"topic": "refund"}, "refunds within 30 days of delivery")


def _customer(i: int) -> tuple[str, dict, dict]:
    return ("lookup_customer", {"id": 100 + i}, {"id": 100 + i, "name": f"c{i}", "order": f"A-{i}"})


def _refund(i: int) -> tuple[str, dict, str]:
    return ("issue_refund", {"order": f"A-{i}"}, f"refund r-{i} issued")


def _done(i: int) -> tuple[str, ...]:
    """The facts after customer ``i`` was handled: one more line per customer."""
    return ("queue: refunds", *(f"refunded A-{j}" for j in range(i + 1)))


def _refunds(n: int) -> tuple[Step, ...]:
    """``n`` customers refunded, one step each: lookup -> the same policy -> refund."""
    return tuple(_s(_customer(i), _POLICY, _refund(i), facts=_done(i)) for i in range(n))


REREAD_LEGIT: list[Trace] = [
    Trace(
        "reread_policy_per_customer",
        "legit",
        _refunds(8),
        tags=_TAG,
        note="lookup -> the same policy -> refund, for eight customers: the facts grow",
    ),
    Trace(
        "reread_policy_first_then_customer",
        "legit",
        tuple(_s(_POLICY, _customer(i), facts=_done(i)) for i in range(10)),
        tags=_TAG,
    ),
    Trace(
        "reread_in_its_own_step",
        "legit",
        tuple(
            s
            for i in range(12)
            for s in (
                _s(_POLICY, facts=_done(i - 1)),  # reading adds no fact: a stale step
                _s(_customer(i), facts=_done(i)),
            )
        ),
        tags=_TAG,
        note="one call per step; the read step itself leaves the state unchanged",
    ),
    Trace(
        "reread_glossary_progress_flags",
        "legit",
        tuple(
            _s(
                ("read_glossary", {"lang": "de"}, "Kunde=customer; Erstattung=refund"),
                ("translate", {"chunk": i}, f"chunk {i} translated"),
                progress=True,
            )
            for i in range(10)
        ),
        tags=_TAG,
        note="no state hash: the agent reports progress=True after each chunk",
    ),
    Trace(
        "reread_two_references_per_ticket",
        "legit",
        tuple(
            _s(
                ("read_policy", {"topic": "sla"}, "reply within 4h"),
                ("get_ticket", {"id": i}, {"id": i, "subject": f"issue {i}"}),
                ("read_pricing", {"plan": "pro"}, "pro: $20/seat"),
                ("reply", {"ticket": i}, f"reply {i} sent"),
                facts=tuple(f"answered {j}" for j in range(i + 1)),
            )
            for i in range(8)
        ),
        tags=_TAG,
    ),
    Trace(
        "reread_long_queue_beyond_window",
        "legit",
        _refunds(30),
        tags=_TAG,
        note="90 calls: the window (20) holds six reads of the policy at a time",
    ),
    Trace(
        "reread_style_guide_between_edits",
        "legit",
        tuple(
            s
            for i in range(9)
            for s in (
                _s(("read", {"path": "STYLE.md"}, "use snake_case; max 100 cols")),
                _s(
                    ("edit", {"path": f"mod{i}.py", "patch": "fmt"}, f"mod{i}.py: 7 lines"),
                    facts=tuple(f"mod{j}.py formatted" for j in range(i + 1)),
                ),
            )
        ),
        tags=_TAG,
    ),
    Trace(
        "reread_cjk_policy_per_order",
        "legit",
        tuple(
            _s(
                ("查询订单", {"订单号": f"D-{i}"}, {"状态": "已签收", "金额": 10 + i}),
                ("读取政策", {"主题": "退款"}, "七天无理由退货"),
                facts=tuple(f"订单 D-{j} 已处理" for j in range(i + 1)),
            )
            for i in range(8)
        ),
        tags=_TAG,
    ),
    Trace(
        "reread_order_varies_per_step",
        "legit",
        tuple(
            _s(*((_customer(i), _POLICY) if i % 2 else (_POLICY, _customer(i))), facts=_done(i))
            for i in range(10)
        ),
        tags=_TAG,
        note="read after the lookup, then before the next one: two reads with nothing between",
    ),
]


REREAD_LEGIT.append(
    Trace(
        "reread_policy_per_page",
        "legit",
        tuple(
            _s(
                ("list_tickets", {"page": i}, [f"t{2 * i}", f"t{2 * i + 1}"]),
                _POLICY,
                facts=tuple(f"page {j} triaged" for j in range(i + 1)),
            )
            for i in range(5)
        ),
        hard=True,
        tags=_TAG,
        note="page is an ignored field: the same call with new rows each time, which hashes "
        "cannot tell from a lookup that returns a new timestamp each time (the next loop)",
    )
)

REREAD_LOOPS: list[Trace] = [
    Trace(
        "reread_no_new_facts",
        "loop",
        tuple(_s(_customer(i), _POLICY, facts=("queue: refunds",)) for i in range(8)),
        tags=_TAG,
        note="new customers come back, but nothing is ever done with them: the state is frozen",
    ),
    Trace(
        "reread_explicit_no_progress",
        "loop",
        tuple(_s(_customer(i), _POLICY, progress=False) for i in range(8)),
        tags=_TAG,
    ),
    Trace(
        "reread_same_customer_forged_facts",
        "loop",
        tuple(_s(_customer(7), _POLICY, facts=(f"attempt {i}",)) for i in range(8)),
        tags=_TAG,
        note="the facts change every step, but no call brings anything new",
    ),
    Trace(
        "alternate_two_lookups_state_frozen",
        "loop",
        tuple(
            s
            for _ in range(5)
            for s in (
                _s(_customer(7), facts=("need order",)),
                _s(("lookup_orders", {"customer": 107}, []), facts=("need order",)),
            )
        ),
        tags=_TAG,
    ),
    Trace(
        "alternate_two_lookups_new_rows_state_frozen",
        "loop",
        tuple(
            s
            for i in range(6)
            for s in (
                _s(("lookup_customer", {"id": 107}, {"seen_at": i}), facts=("need order",)),
                _s(("lookup_orders", {"customer": 107}, {"etag": i}), facts=("need order",)),
            )
        ),
        tags=_TAG,
        note="every result differs (timestamps, etags) but the state never moves",
    ),
    Trace(
        "reread_between_repeated_drafts_forged_facts",
        "loop",
        tuple(
            _s(
                _POLICY,
                _customer(7),
                ("draft_reply", {"customer": 107}, "draft: we are checking"),
                facts=(f"draft v{i}",),
            )
            for i in range(6)
        ),
        tags=_TAG,
    ),
    Trace(
        "reread_progress_then_stuck",
        "loop",
        _refunds(4) + tuple(_s(_customer(4), _POLICY, facts=_done(3)) for _ in range(6)),
        tags=_TAG,
        loop_start=4,
        note="four customers refunded, then the same customer and policy over and over",
    ),
    Trace(
        "reread_thrice_in_one_step",
        "loop",
        (
            *_refunds(3),
            _s(_customer(3), _POLICY, _POLICY, _POLICY, _POLICY, facts=_done(3)),
        ),
        tags=_TAG,
        loop_start=3,
    ),
    Trace(
        "reread_same_customer_new_timestamps_forged_facts",
        "loop",
        tuple(
            _s(
                ("lookup_customer", {"id": 107}, {"id": 107, "fetched_at": f"12:0{i}"}),
                _POLICY,
                facts=(f"attempt {i}",),
            )
            for i in range(8)
        ),
        tags=_TAG,
        note="each lookup result is new (a timestamp), but it is the same lookup each time",
    ),
    Trace(
        "cycle_of_5_forged_facts",
        "loop",
        tuple(
            _s((f"tool{j}", {"x": j}, f"out{j}"), facts=(f"claim {r}.{j}",))
            for r in range(4)
            for j in range(5)
        ),
        tags=_TAG,
        note="five calls replayed with the same results while the facts claim to grow",
    ),
    Trace(
        "rephrased_search_forged_facts",
        "loop",
        tuple(
            _s(("search", {"q": f"refund rule {i}"}, "no results"), _POLICY, facts=(f"try {i}",))
            for i in range(8)
        ),
        tags=_TAG,
        note="varied arguments, the same empty result, between reads of the policy",
    ),
    Trace(
        "reread_facts_grow_without_new_results",
        "loop",
        tuple(
            _s(_POLICY, ("check_inbox", {}, "no new mail"), facts=(f"note {i}",)) for i in range(6)
        ),
        tags=_TAG,
    ),
]
