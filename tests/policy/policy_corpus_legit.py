"""Legitimate traces of the corpus: none should be stopped (see policy_corpus.py)."""

from __future__ import annotations

from policy_corpus_base import Step, Trace
from policy_corpus_base import one_call_steps as _one_call_steps
from policy_corpus_base import step as _s

__all__ = ["LEGIT"]

LEGIT: list[Trace] = [
    Trace(
        "read_edit_read",
        "legit",
        tuple(
            s
            for i in range(5)
            for s in (
                _s(("read", {"path": "app.py"}, f"app.py v{i}")),
                _s(("edit", {"path": "app.py", "patch": f"p{i}"}, "ok")),
            )
        ),
    ),
    Trace(
        "test_fix_improving",
        "legit",
        tuple(
            s
            for i in range(6)
            for s in (
                _s(
                    ("run_tests", {"suite": "unit"}, f"{6 + i} passed, {6 - i} failed"),
                    facts=(f"failing={6 - i}",),
                ),
                _s(
                    ("edit", {"file": "pay.py", "patch": f"fix {i}"}, f"diff {i}"),
                    facts=(f"failing={6 - i}", f"fix {i}"),
                ),
            )
        ),
    ),
    Trace(
        "test_fix_changing_errors",
        "legit",
        tuple(
            s
            for i in range(6)
            for s in (
                _s(("run_tests", {}, f"1 failed: AssertionError line {10 * i}")),
                _s(("edit", {"file": "x.py", "line": 10 * i}, f"diff {i}")),
            )
        ),
        note="still failing, but the failure moves: new information each time",
    ),
    Trace(
        "pagination_new_rows",
        "legit",
        _one_call_steps(
            [("list_tickets", {"page": i}, [f"t{3 * i}", f"t{3 * i + 1}"]) for i in range(12)]
        ),
    ),
    Trace(
        "research_fan_out",
        "legit",
        tuple(
            s
            for i in range(8)
            for s in (
                _s(
                    ("search", {"q": f"topic {i}"}, [f"url{i}a", f"url{i}b"]),
                    facts=tuple(f"f{j}" for j in range(i)),
                ),
                _s(
                    ("fetch", {"url": f"url{i}a"}, f"doc {i}"),
                    facts=tuple(f"f{j}" for j in range(i + 1)),
                ),
            )
        ),
    ),
    Trace(
        "customer_service_flow",
        "legit",
        (
            _s(("lookup_order", {"id": "A-1"}, {"status": "delivered"}), progress=True),
            _s(("verify_identity", {"user": "u1"}, "verified"), progress=True),
            _s(("check_policy", {"topic": "refund"}, "30 days"), progress=True),
            _s(("issue_refund", {"order": "A-1", "amount": 12.5}, "refund r-9"), progress=True),
            _s(("send_email", {"to": "u1", "template": "refund"}, "sent"), progress=True),
        ),
    ),
    Trace(
        "polling_with_progress",
        "legit",
        _one_call_steps(
            [
                ("job_status", {"id": "j1"}, s)
                for s in ("queued", "running 10%", "running 40%", "running 80%", "done")
            ]
        ),
        tags=("polling",),
    ),
    Trace(
        "batch_edits_distinct_diffs",
        "legit",
        _one_call_steps(
            [
                ("edit", {"file": f"m{i}.py", "patch": "rename"}, f"m{i}.py: 3 lines")
                for i in range(8)
            ]
        ),
    ),
    Trace(
        "reread_once_for_confirmation",
        "legit",
        _one_call_steps(
            [
                ("read", {"path": "cfg.yaml"}, "port: 80"),
                ("plan", {"step": 1}, "change port"),
                ("read", {"path": "cfg.yaml"}, "port: 80"),
                ("edit", {"path": "cfg.yaml", "patch": "port: 8080"}, "ok"),
                ("read", {"path": "cfg.yaml"}, "port: 8080"),
            ]
        ),
    ),
    Trace(
        "browser_checkout",
        "legit",
        _one_call_steps(
            [
                ("navigate", {"url": "https://shop"}, "page:home"),
                ("click", {"selector": "#item-3"}, "page:item3"),
                ("click", {"selector": "#add"}, "page:item3+cart1"),
                ("navigate", {"url": "https://shop/cart"}, "page:cart1"),
                ("click", {"selector": "#checkout"}, "page:pay"),
                ("type", {"selector": "#card", "text": "4111"}, "page:pay+card"),
                ("click", {"selector": "#pay"}, "page:done"),
            ]
        ),
    ),
    Trace(
        "code_search_exploration",
        "legit",
        _one_call_steps(
            [("grep", {"pattern": p}, [f"{p}.py:{n}"]) for n, p in enumerate("abcdefghij")]
            + [("read", {"path": "a.py"}, "def a(): ...")]
        ),
    ),
    Trace(
        "retry_then_success",
        "legit",
        _one_call_steps(
            [
                ("http_get", {"url": "https://api/x"}, "HTTP 503"),
                ("http_get", {"url": "https://api/x"}, "HTTP 200 {...}"),
                ("parse", {"body": "..."}, {"ok": True}),
            ]
        ),
    ),
    Trace(
        "calculator_chain",
        "legit",
        _one_call_steps([("calc", {"expr": f"{i}*{i}"}, i * i) for i in range(2, 14)]),
    ),
    Trace(
        "long_diverse_run",
        "legit",
        tuple(
            _s(
                (["search", "read", "calc", "write"][i % 4], {"arg": i}, f"r{i}"),
                facts=tuple(f"fact{j}" for j in range(i // 2 + 1)),
            )
            for i in range(30)
        ),
        note="facts grow every other step: 1 stale step at a time",
    ),
    Trace(
        "search_summarise_alternation",
        "legit",
        tuple(
            s
            for i in range(6)
            for s in (
                _s(("search", {"q": "llm agents", "page": i}, [f"hit{i}"])),
                _s(("summarise", {"text": f"hit{i}"}, f"summary {i}")),
            )
        ),
    ),
    Trace(
        "exploration_then_progress",
        "legit",
        tuple(
            [_s(("search", {"q": f"lead {i}"}, f"nothing {i}"), facts=("start",)) for i in range(6)]
            + [_s(("read", {"path": "found.md"}, "answer"), facts=("start", "answer found"))]
            + [_s(("write", {"path": "out.md"}, "ok"), facts=("start", "answer found", "written"))]
        ),
        note="6 stale steps, under the no_progress threshold of 8",
    ),
    Trace(
        "faq_single_lookup",
        "legit",
        (_s(("kb_search", {"q": "opening hours"}, "9-18")), Step((), None, True)),
    ),
    Trace(
        "fan_out_users",
        "legit",
        _one_call_steps([("get_user", {"id": i}, {"id": i, "name": f"u{i}"}) for i in range(15)]),
    ),
    Trace(
        "fan_out_some_not_found",
        "legit",
        _one_call_steps(
            [
                ("get_user", {"id": i}, "not found" if i in (3, 4, 5) else {"id": i})
                for i in range(12)
            ]
        ),
        note="three misses in a row while looking up different ids",
    ),
    Trace(
        "retry_with_backoff_recovers",
        "legit",
        _one_call_steps(
            [
                ("db_query", {"sql": "select 1"}, "timeout"),
                ("sleep", {"s": 1}, None),
                ("db_query", {"sql": "select 1"}, "timeout"),
                ("sleep", {"s": 2}, None),
                ("db_query", {"sql": "select 1"}, [[1]]),
            ]
        ),
        note="two identical failures then success: warned, not stopped",
    ),
    Trace(
        "batch_rename_ack_results",
        "legit",
        _one_call_steps([("rename", {"src": f"f{i}", "dst": f"g{i}"}, "ok") for i in range(8)]),
        hard=True,
        note="acks carry no information: indistinguishable from 'same empty result' by hashes",
    ),
    Trace(
        "long_job_polling",
        "legit",
        _one_call_steps(
            [("job_status", {"id": "j9"}, "running")] * 4 + [("job_status", {"id": "j9"}, "done")]
        ),
        hard=True,
        tags=("polling",),
        note="a status without progress detail looks exactly like a stuck poll",
    ),
]
