"""Loop traces of the corpus: each should be stopped (see policy_corpus.py)."""

from __future__ import annotations

from policy_corpus_base import EMPTY, Step, Trace
from policy_corpus_base import one_call_steps as _one_call_steps
from policy_corpus_base import step as _s

__all__ = ["LOOPS"]

LOOPS: list[Trace] = [
    Trace(
        "exact_repeat_search",
        "loop",
        _one_call_steps([("search", {"q": "杭州天气"}, "晴 18°C")] * 5),
    ),
    Trace(
        "cjk_rephrased_repeat",
        "loop",
        _one_call_steps(
            [
                ("search", {"q": "杭州天气"}, "晴 18°C"),
                ("search", {"q": "天气 杭州"}, "晴 18°C"),
                ("search", {"q": "杭州 天气"}, "晴 18°C"),
                ("search", {"q": " 天气杭州 "}, "晴 18°C"),
            ]
        ),
    ),
    Trace(
        "key_order_and_case_repeat",
        "loop",
        _one_call_steps(
            [
                ("get_order", {"id": 1, "fields": "status"}, {"status": "shipped"}),
                ("get_order", {"fields": "status", "id": "1"}, {"status": "shipped"}),
                ("Get_Order", {" ID ": 1.0, "Fields": "STATUS"}, {"status": "shipped"}),
                ("get_order", {"id": 1, "fields": "status"}, {"status": "shipped"}),
            ]
        ),
    ),
    Trace(
        "search_edit_oscillation",
        "loop",
        _one_call_steps(
            [
                ("search", {"q": "config loader"}, ["a.py"]),
                ("edit", {"file": "a.py", "patch": "x=1"}, "ok"),
            ]
            * 4
        ),
    ),
    Trace(
        "refund_alternation_page_ignored",
        "loop",
        _one_call_steps(
            [
                x
                for i in range(1, 8)
                for x in (
                    ("order_query", {"order": "A-100", "page": i}, EMPTY),
                    ("kb_search", {"q": "refund status", "offset": 10 * i}, EMPTY),
                )
            ]
        ),
        note="seed 003: page/offset change, the API ignores them",
    ),
    Trace(
        "varied_args_same_empty_result",
        "loop",
        _one_call_steps(
            [
                ("order_query", {"order": "A-100"}, EMPTY),
                ("order_query", {"tracking": "SF123"}, EMPTY),
                ("kb_search", {"q": "refund not received"}, EMPTY),
                ("order_query", {"order": "a100"}, EMPTY),
                ("order_query", {"phone": "138-0000"}, EMPTY),
                ("kb_search", {"q": "refund delay"}, EMPTY),
                ("order_query", {"email": "x@y.z"}, EMPTY),
            ]
        ),
    ),
    Trace(
        "cycle_of_3",
        "loop",
        _one_call_steps(
            [
                ("list_dir", {"path": "src"}, ["a.py", "b.py"]),
                ("read", {"path": "src/a.py"}, "def a(): ..."),
                ("grep", {"pattern": "a("}, ["src/a.py:1"]),
            ]
            * 4
        ),
    ),
    Trace(
        "cycle_of_4",
        "loop",
        _one_call_steps(
            [
                ("navigate", {"url": "https://shop/cart"}, "page:cart"),
                ("click", {"selector": "#checkout"}, "page:login"),
                ("type", {"selector": "#user", "text": "bob"}, "ok:typed"),
                ("click", {"selector": "#submit"}, "page:error"),
            ]
            * 4
        ),
    ),
    Trace(
        "repeat_in_window_interleaved",
        "loop",
        _one_call_steps(
            [
                ("get_policy", {"topic": "refund"}, "30 days"),
                ("calc", {"expr": "1+1"}, 2),
                ("get_policy", {"topic": "refund"}, "30 days"),
                ("lookup_user", {"id": 7}, {"name": "li"}),
                ("calc", {"expr": "2+2"}, 4),
                ("get_policy", {"topic": "Refund"}, "30 days"),
                ("get_policy", {"topic": "refund"}, "30 days"),
            ]
        ),
    ),
    Trace(
        "stagnation_varied_actions",
        "loop",
        tuple(
            _s(("search", {"q": f"angle {i}"}, f"snippet {i}"), facts=("bug in payment.py",))
            for i in range(12)
        ),
        note="new snippets every step but the task state never changes",
    ),
    Trace(
        "stagnation_explicit_no_progress",
        "loop",
        tuple(_s(("think", {"n": i}, f"idea {i}"), progress=False) for i in range(10)),
    ),
    Trace(
        "test_fix_no_improvement",
        "loop",
        tuple(
            s
            for i in range(6)
            for s in (
                _s(("edit", {"file": "pay.py", "patch": f"try {i}"}, f"diff {i}")),
                _s(("run_tests", {"suite": "unit"}, "8 passed, 4 failed: test_refund")),
            )
        ),
        note="seed 000 §8.5: P stays 4, edits change nothing",
    ),
    Trace(
        "retry_same_error",
        "loop",
        _one_call_steps([("http_get", {"url": "https://api/x"}, "HTTP 500")] * 4),
    ),
    Trace(
        "date_format_rotation",
        "loop",
        _one_call_steps(
            [
                ("orders_by_date", {"date": "2026-11-30"}, EMPTY),
                ("orders_by_date", {"date": "2026/11/30"}, EMPTY),
                ("orders_by_date", {"date": "2026-11-30T00:00:00"}, EMPTY),
                ("orders_by_date", {"date": "2026.11.30"}, EMPTY),
            ]
        ),
    ),
    Trace(
        "numeric_forms",
        "loop",
        _one_call_steps(
            [
                ("get_item", {"id": 1}, {"sku": "x"}),
                ("get_item", {"id": "1"}, {"sku": "x"}),
                ("get_item", {"id": 1.0}, {"sku": "x"}),
                ("get_item", {"id": "1.0"}, {"sku": "x"}),
            ]
        ),
    ),
    Trace(
        "pagination_same_page",
        "loop",
        _one_call_steps([("list_tickets", {"page": i}, ["t1", "t2"]) for i in range(1, 6)]),
        note="the API ignores page and returns page 1 every time",
    ),
    Trace(
        "three_tool_rotation_cursor_varies",
        "loop",
        _one_call_steps(
            [
                x
                for i in range(5)
                for x in (
                    ("crm_find", {"name": "acme", "cursor": f"c{i}"}, {"hits": 0}),
                    ("kb_search", {"q": "acme contract"}, EMPTY),
                    ("mail_search", {"from": "acme", "request_id": i}, EMPTY),
                )
            ]
        ),
    ),
    Trace(
        "polling_never_changes",
        "loop",
        _one_call_steps([("job_status", {"id": "j1"}, "pending")] * 6),
    ),
    Trace(
        "rephrased_searches_no_results",
        "loop",
        _one_call_steps(
            [
                ("search", {"q": q}, "no results")
                for q in (
                    "acme refund policy",
                    "acme refund rules",
                    "refunds at acme",
                    "acme return policy",
                    "acme money back",
                    "acme reimbursement",
                    "acme chargeback",
                )
            ]
        ),
    ),
    Trace(
        "model_only_spinning",
        "loop",
        tuple(Step((), None, False) for _ in range(10)),
    ),
    Trace(
        "browser_clicks_same_page",
        "loop",
        _one_call_steps([("click", {"selector": f"#btn-{i}"}, "page-hash:3f2a") for i in range(7)]),
    ),
    Trace(
        "alternation_varied_args_state_frozen",
        "loop",
        tuple(
            s
            for i in range(6)
            for s in (
                _s(("order_query", {"order": f"A-{i}"}, EMPTY), facts=("need order id",)),
                _s(
                    ("kb_search", {"q": f"where is order {i}"}, ["faq#2"]), facts=("need order id",)
                ),
            )
        ),
    ),
]
