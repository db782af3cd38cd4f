"""A labelled corpus of agent traces for the loop and stagnation detector.

Written by hand from the runaway patterns in DESIGN §1 and the seeds (003: the refund bot that
alternates order_query/kb_search with shifting arguments and always gets an empty result;
000 §8: exact repeats, "天气 杭州" rephrasings, read -> edit -> test cycles). ``label`` is what a
careful human reviewer would say: ``loop`` (the run should be stopped) or ``legit`` (it must not
be). ``hard`` marks legitimate traces that a fingerprint detector cannot tell from a loop
without more signal (kept in the corpus so the false-positive figure stays honest).

Shared by ``tests/policy/test_policy_corpus.py`` and ``benchmarks/loop_corpus.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from guard.policy import Action, Fingerprinter, LoopDetector, LoopSettings

__all__ = ["CORPUS", "LEGIT", "LOOPS", "Call", "Step", "Trace", "TraceResult", "run_trace"]


@dataclass(frozen=True)
class Call:
    tool: str
    args: Any
    result: Any


@dataclass(frozen=True)
class Step:
    calls: tuple[Call, ...] = ()
    facts: tuple[str, ...] | None = None  # the task state after the step, when the agent says
    progress: bool | None = None


@dataclass(frozen=True)
class Trace:
    name: str
    label: str  # "loop" | "legit"
    steps: tuple[Step, ...]
    hard: bool = False
    note: str = ""
    tags: tuple[str, ...] = field(default=())


def _s(*calls: tuple[str, Any, Any], facts: tuple[str, ...] | None = None, progress=None) -> Step:
    return Step(tuple(Call(*c) for c in calls), facts, progress)


def _one_call_steps(calls: list[tuple[str, Any, Any]]) -> tuple[Step, ...]:
    return tuple(_s(c) for c in calls)


EMPTY: list[Any] = []

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
        note="a status without progress detail looks exactly like a stuck poll",
    ),
]

CORPUS: list[Trace] = LOOPS + LEGIT


@dataclass(frozen=True)
class TraceResult:
    stopped: bool
    warned: bool
    stop_call: int | None  # tool calls seen when the run was stopped
    pattern: str | None
    hits: int


def run_trace(trace: Trace, settings: LoopSettings | None = None) -> TraceResult:
    """Feed a trace to a fresh detector the way the SDK and the guard do."""
    settings = settings or LoopSettings()
    fp = Fingerprinter(b"corpus-key", ignore_fields=settings.ignore_fields)
    det = LoopDetector(settings)
    warned, n = False, 0
    for step in trace.steps:
        verdicts = []
        for call in step.calls:
            n += 1
            v = det.observe_action(fp.action(call.tool, call.args), fp.result(call.result))
            verdicts.append((n, v))
        state = fp.state(step.facts) if step.facts is not None else None
        verdicts.append(
            (n, det.end_step(state=state, progress=step.progress, acted=bool(step.calls)))
        )
        for i, v in verdicts:
            if v.level is Action.STOP:
                return TraceResult(True, warned, i, v.pattern, det.hits)
            warned = warned or v.level is Action.WARN
    return TraceResult(False, warned, None, None, det.hits)
