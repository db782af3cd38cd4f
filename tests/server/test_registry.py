"""Registry decisions without the network: span-only runs, nesting, detach, forecast, dedup."""

from __future__ import annotations

from guard.policy import DecidedBy, Reason, Status
from guard.server import MemorySink, decode_request
from guard.server.control._fanout import AgentSession
from guard.server.runs._registry import Registry
from guard.server.runtime._auth import ANONYMOUS
from guard.v1 import guard_pb2 as pb

from .conftest import config, model_span, request, span, step_span, tool_span, trace_id_of


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _registry(**cfg):
    sink = MemorySink()
    clock = Clock()
    reg = Registry(config(**cfg), sink, guard_id="t", clock=clock)
    session = AgentSession("s", None, reg.log, reg.clock)
    reg.hello(session, pb.Hello(process_id="p", tenant="acme"), ANONYMOUS)
    return reg, session, sink, clock


def _sent(session: AgentSession) -> list[tuple[str, pb.GuardMessage]]:
    out = []
    while not session.queue.empty():
        m = session.queue.get_nowait()
        if isinstance(m, pb.GuardMessage):
            out.append((m.WhichOneof("body"), m))
    return out


def _start(reg, session, run_id, n, **kw):
    rs = pb.RunStarted(run_id=run_id, trace_id=trace_id_of(n).hex(), tenant="acme", **kw)
    reg.register(session, rs, ANONYMOUS)


def test_span_only_run_is_tracked_and_ended_by_its_run_span():
    reg, _, sink, _ = _registry()
    tid = trace_id_of(1)
    reg.ingest(decode_request(request(model_span("solo", tid, tokens_in=5))), ANONYMOUS)
    assert reg.runs["solo"].session is None
    end = span(
        "invoke_agent bot",
        tid,
        {
            "gen_ai.operation.name": "invoke_agent",
            "guard.run.id": "solo",
            "guard.stop.status": "terminated",
            "guard.stop.reason": "max_steps",
        },
    )
    reg.ingest(decode_request(request(end)), ANONYMOUS)
    (outcome,) = sink.runs
    assert (outcome.status, outcome.reason, outcome.input_tokens) == (
        Status.TERMINATED,
        Reason.MAX_STEPS,
        5,
    )
    # late spans of an ended run change nothing
    reg.ingest(decode_request(request(model_span("solo", tid))), ANONYMOUS)
    assert "solo" not in reg.runs and reg.stats["late_spans"] == 1


def test_nested_run_spends_the_parents_budget():
    reg, session, _, _ = _registry()
    _start(reg, session, "parent", 1, requested=pb.Limits(max_tokens=1000))
    _start(reg, session, "child", 1, parent_run_id="parent")
    _sent(session)
    reg.ingest(
        decode_request(request(model_span("child", trace_id_of(1), tokens_in=1200))), ANONYMOUS
    )
    cancels = {m.cancel.run_id: m.cancel.reason for k, m in _sent(session) if k == "cancel"}
    assert cancels == {"parent": "token_budget"}
    assert reg.runs["parent"].budget.usage().input_tokens == 1200


def test_operator_cancel_of_a_detached_run_ends_it_now_and_reconnect_is_told():
    reg, session, sink, _ = _registry()
    _start(reg, session, "r", 1)
    reg.detach(session)
    assert reg.runs["r"].detached_at is not None
    assert reg.cancel("run_id", "r", "", ANONYMOUS) == ["r"]
    (outcome,) = sink.runs
    assert outcome.reason is Reason.OPERATOR_CANCEL and outcome.decided_by is DecidedBy.OPERATOR
    again = AgentSession("s2", None, reg.log, reg.clock)
    hello = pb.Hello(process_id="p", tenant="acme", live_runs=[pb.RunStarted(run_id="r")])
    reg.hello(again, hello, ANONYMOUS)
    kinds = [k for k, _ in _sent(again)]
    assert kinds == ["cancel"] and "r" not in reg.runs


def test_grace_expiry_and_reattach_within_grace():
    reg, session, sink, clock = _registry(guard={"agent_grace_s": 5})
    _start(reg, session, "a", 1)
    _start(reg, session, "b", 2)
    reg.detach(session)
    clock.t += 3
    back = AgentSession("s2", None, reg.log, reg.clock)
    reg.hello(back, pb.Hello(process_id="p", live_runs=[pb.RunStarted(run_id="a")]), ANONYMOUS)
    clock.t += 3
    reg.sweep()
    assert [o.run_id for o in sink.runs] == ["b"]
    assert sink.runs[0].reason is Reason.AGENT_LOST
    assert reg.runs["a"].connected


def test_forecast_warns_before_the_token_budget_runs_out():
    reg, session, _, _ = _registry()
    _start(reg, session, "f", 1, requested=pb.Limits(max_tokens=20_000))
    tid = trace_id_of(1)
    warned_at = None
    for i in range(1, 12):  # input grows 1000 per step: B + (n-1)·D
        spans = [model_span("f", tid, tokens_in=1000 * i, tokens_out=0), step_span("f", tid, i)]
        reg.ingest(decode_request(request(*spans)), ANONYMOUS)
        msgs = _sent(session)
        if any(k == "warn" and "forecast" in m.warn.detail for k, m in msgs):
            warned_at = i
            break
        if any(k == "cancel" for k, _ in msgs):
            break
    assert warned_at is not None and warned_at <= 5  # 1+2+3+4+5 = 15k of 20k: 6th step ends it


def test_duplicate_run_ended_is_written_once():
    reg, session, sink, _ = _registry()
    _start(reg, session, "d", 1)
    from guard.policy import Outcome

    o = Outcome(run_id="d", status=Status.COMPLETED, reason=Reason.FINAL_ANSWER, tenant="acme")
    reg.ended_by_agent(session, o, ANONYMOUS)
    reg.ended_by_agent(session, o, ANONYMOUS)
    assert len(sink.runs) == 1 and "d" not in reg.runs


def test_heartbeat_pause_and_deadline():
    reg, session, _, clock = _registry()
    _start(reg, session, "h", 1, requested=pb.Limits(deadline_s=10))
    _sent(session)
    clock.t += 11
    reg.heartbeat(session, pb.Heartbeat(runs=[pb.RunProgress(run_id="h")]))
    (_kind, msg), *_ = [x for x in _sent(session) if x[0] == "cancel"]
    assert msg.cancel.reason == "deadline"


def test_tool_calls_batched_per_request_still_count_and_stop_in_order():
    """Tool calls go into the budget once per run per request: the counts, the parent's
    budget, the tenant's window, the run's outcome (ended mid-request) and the tool quota
    stop must be what one record per span gave."""
    reg, session, sink, _ = _registry(tenants={"acme": {"rolling": []}})
    _start(reg, session, "parent", 1)
    _start(reg, session, "child", 1, parent_run_id="parent", requested=pb.Limits(max_tool_calls=3))
    _sent(session)
    tid = trace_id_of(1)
    tools = [tool_span("child", tid, f"{i:032x}") for i in range(3)]
    reg.ingest(decode_request(request(*tools, step_span("child", tid, 1))), ANONYMOUS)
    child, parent = reg.runs["child"], reg.runs["parent"]
    assert child.budget.usage().tool_calls == parent.budget.usage().tool_calls == 3
    assert [m.cancel.reason for k, m in _sent(session) if k == "cancel"] == ["max_tool_calls"]
    assert child.stop_reason is Reason.MAX_TOOL_CALLS

    # a span-only run ended by its run span in the same request: its outcome has every call
    solo = trace_id_of(2)
    end = span(
        "invoke_agent bot",
        solo,
        {"gen_ai.operation.name": "invoke_agent", "guard.run.id": "solo"},
    )
    tools = [tool_span("solo", solo, f"{i + 7:032x}") for i in range(4)]
    reg.ingest(decode_request(request(model_span("solo", solo), *tools, end)), ANONYMOUS)
    (outcome,) = [o for o in sink.runs if o.run_id == "solo"]
    assert (outcome.tool_calls, outcome.tool_attempts, outcome.model_calls) == (4, 4, 1)


def test_a_signed_result_hash_is_counted_not_a_failed_batch():
    """guard.result.hash is only compared, so any string may arrive. "-1" once parsed to a
    negative ring value and raised OverflowError out of ingest, failing the whole request."""
    reg, _, _, _ = _registry()
    tid = trace_id_of(7)
    fp = "7ce842609ec9c94124d9c36704e8ec53"
    reg.ingest(decode_request(request(model_span("signed", tid))), ANONYMOUS)
    for _ in range(2):
        reg.ingest(decode_request(request(tool_span("signed", tid, fp, result="-1"))), ANONYMOUS)
    run = reg.runs["signed"]
    assert run.budget.usage().tool_calls == 2
    assert run.detector.hits == 1  # the same call with the same (hashed) result: warned
