"""Tenant isolation matrix (issue 11 §4): every RPC and every field that names a run, with
tenant acme's token aimed at tenant globex's runs, against a real guard with auth on.

For each case: globex's runs (usage, state, parent links, session, stop reason), its records
and decisions, and what its agent was told stay exactly as they were; and acme's answer for
globex's run id is the answer for an id nobody has (same status, same words but the id).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest

from guard.server import GuardServer
from guard.v1 import guard_pb2 as pb
from guard.v1 import guard_pb2_grpc

from .conftest import AUTH, AUTH_ENV, Agent, config, model_span, span, step_span, trace_id_of

B_RUN, B_CHILD, B_TRACE = "run-b-7f3a", "run-b-child-91c2", trace_id_of(0xB0)
UNKNOWN = "nobody-has-this-run"


def _snapshot(srv: GuardServer, sink: Any, b: Agent) -> Any:
    """Everything tenant globex could observe or be charged."""
    runs = []
    for rid in sorted(srv.registry.by_tenant.get("globex", ())):
        r = srv.registry.runs[rid]
        u = r.budget.usage()
        runs.append(
            (
                rid,
                (u.steps, u.model_calls, u.tool_calls, u.input_tokens, u.output_tokens),
                u.cost_usd,
                r.stop_reason,
                r.paused,
                r.detached_at,
                r.parent_run_id,
                r.session is not None and r.session.tenant,
                r.gate_tokens,
                r.gate_cost_usd,
            )
        )
    records = [(o.run_id, o.tenant, o.status, o.reason) for o in sink.runs if o.tenant == "globex"]
    decisions = [(d.run_id, d.action) for d in sink.decisions if d.tenant == "globex"]
    told = [m.WhichOneof("body") for m in b.messages]
    window = srv.registry.budgets.status("globex")
    return runs, records, decisions, told, [(w.metric, w.used) for w in window.windows]


_probes = iter(range(1, 1 << 20))


async def _settled(srv: GuardServer, sink: Any, b: Agent) -> Any:
    """The snapshot once whatever the guard had queued for globex's agent has arrived: a
    barrier, not a sleep. A probe run's Admit comes down b's stream after any message queued
    before it; the probe itself (its run, and what b was told about it) is left out."""
    n = next(_probes)
    probe = f"probe-{n}"
    assert (await b.start_run(probe, trace_id_of(0xB100 + n))).WhichOneof("body") == "admit"
    runs, records, decisions, _, window = _snapshot(srv, sink, b)
    told = [
        kind
        for m in b.messages
        if getattr(getattr(m, kind := m.WhichOneof("body")), "run_id", None) != probe
    ]
    return [r for r in runs if r[0] != probe], records, decisions, told, window


def _same_words(a: str, b: str) -> bool:
    return a.replace(B_RUN, "<id>").replace(B_CHILD, "<id>") == b.replace(UNKNOWN, "<id>")


async def _answer(coro: Awaitable[Any]) -> tuple[str, str]:
    try:
        resp = await coro
    except grpc.aio.AioRpcError as exc:
        return exc.code().name, exc.details() or ""
    return "OK", str(resp)


@pytest.fixture
async def world(sink):
    tenants = {"globex": {"rolling": [{"metric": "cost_usd", "limit": 1.0, "window_s": 3600}]}}
    cfg = config(auth=AUTH, tenants=tenants)
    async with GuardServer(cfg, listen="127.0.0.1:0", sink=sink, environ=AUTH_ENV) as srv:
        b = Agent(srv.address, token="globex-secret", tenant="globex")
        await b.connect(process_id="B")
        await b.start_run(B_RUN, B_TRACE, agent="globex-bot")
        await b.start_run(B_CHILD, trace_id_of(0xB1), agent="globex-bot", parent_run_id=B_RUN)
        await b.export(model_span(B_RUN, B_TRACE, tokens_in=10, **{"guard.cost.usd": 0.25}))
        await b.export(step_span(B_RUN, B_TRACE, 1))
        yield srv, sink, b
        await b.close()


async def _agent(srv: GuardServer, pid: str) -> Agent:
    a = Agent(srv.address, token="acme-secret", tenant="acme")
    await a.connect(process_id=pid)
    return a


def _spend(run_id: str, trace: bytes, **extra: Any) -> list[Any]:
    cost = {"guard.cost.usd": 5.0, **extra}
    return [model_span(run_id, trace, tokens_in=10**6, **cost), step_span(run_id, trace, 1)]


async def _control_answer(srv: GuardServer, msg: pb.AgentMessage, pid: str) -> tuple[str, str]:
    """Send one message on a fresh acme stream; the stream's state afterwards (still up, or
    ended with which status)."""
    a = await _agent(srv, pid)
    await a.outbox.put(msg)
    answer = ("UP", "")
    try:  # a round trip after it
        await a.start_run(f"{pid}-probe", trace_id_of(0xA0 + len(pid)))
    except grpc.aio.AioRpcError as exc:
        answer = (exc.code().name, exc.details() or "")
    await a.close()
    return answer


def _cases() -> list[tuple[str, Callable[[str], Any]]]:
    """(name, make(run_id) -> coroutine function(srv, admin stub, acme agent)) pairs."""

    def control(make_msg: Callable[[str], pb.AgentMessage]) -> Callable[[str], Any]:
        def make(rid: str) -> Any:
            return lambda srv, stub, a: _control_answer(srv, make_msg(rid), f"c{rid[:3]}")

        return make

    def export(make_spans: Callable[[str], list[Any]]) -> Callable[[str], Any]:
        def make(rid: str) -> Any:
            async def run(srv: GuardServer, stub: Any, a: Agent) -> tuple[str, str]:
                code, text = await _answer(a.export(*make_spans(rid)))
                return code, text

            return run

        return make

    def admin(method: str, make_req: Callable[[str], Any]) -> Callable[[str], Any]:
        def make(rid: str) -> Any:
            return lambda srv, stub, a: _answer(
                getattr(stub, method)(make_req(rid), metadata=a.metadata)
            )

        return make

    def started(**kw: Any) -> Callable[[str], Any]:
        def make(rid: str) -> Any:
            async def run(srv: GuardServer, stub: Any, a: Agent) -> tuple[str, str]:
                child = f"a-child-{len(kw)}-{rid[:3]}"
                fields = {k: (rid if v is None else v) for k, v in kw.items()}
                reply = await a.start_run(fields.pop("run_id", child), trace_id_of(0xAC), **fields)
                await a.export(*_spend(child, trace_id_of(0xAC)))
                kind = reply.WhichOneof("body")
                run = srv.registry.runs.get(child)
                linked = run is not None and run.parent is not None
                return kind, f"linked={linked}"

            return run

        return make

    return [
        ("RunStarted.parent_run_id", started(parent_run_id=None)),
        ("RunEnded.outcome.run_id", control(lambda r: _ended(r))),
        (
            "Heartbeat.runs.run_id",
            control(
                lambda r: pb.AgentMessage(
                    heartbeat=pb.Heartbeat(runs=[pb.RunProgress(run_id=r, paused=True)])
                )
            ),
        ),
        ("Ack.run_id", control(lambda r: pb.AgentMessage(ack=pb.Ack(command_id=1, run_id=r)))),
        (
            "AllowanceRequest.run_id",
            control(lambda r: _allowance(r)),
        ),
        ("span guard.run.id", export(lambda r: _spend(r, trace_id_of(0xA1)))),
        (
            "span guard.parent_run.id",
            export(
                lambda r: _spend(
                    f"a-implicit-{r[:3]}", trace_id_of(0xA2), **{"guard.parent_run.id": r}
                )
            ),
        ),
        ("span in the run's trace (no guard.run.id)", export(lambda r: [_foreign_call(r)])),
        (
            "Cancel.run_id",
            admin("Cancel", lambda r: pb.CancelRequest(selector=pb.Selector(run_id=r))),
        ),
        ("ListRuns", admin("ListRuns", lambda r: pb.ListRunsRequest())),
        ("TenantBudgets", admin("TenantBudgets", lambda r: pb.TenantBudgetsRequest())),
        ("Stats", admin("Stats", lambda r: pb.StatsRequest())),
    ]


def _foreign_call(rid: str) -> Any:
    """An instrumentation's model span (no guard.run.id) in the trace of run ``rid``."""
    trace = B_TRACE if rid == B_RUN else trace_id_of(0xDEAD)
    attrs = {"gen_ai.usage.input_tokens": 10**6, "gen_ai.usage.output_tokens": 1}
    return span("chat other-llm", trace, attrs)


def _ended(rid: str) -> pb.AgentMessage:
    outcome = pb.Outcome(run_id=rid, status="cancelled", reason="operator_cancel")
    return pb.AgentMessage(run_ended=pb.RunEnded(outcome=outcome))


def _allowance(rid: str) -> pb.AgentMessage:
    msg = pb.AgentMessage()
    field = pb.AgentMessage.DESCRIPTOR.fields_by_name.get("allowance_request")
    if field is not None:
        msg.allowance_request.run_id = rid
        msg.allowance_request.cost_usd = 5.0
        msg.allowance_request.request_id = 1
    return msg


@pytest.mark.parametrize(("name", "make"), _cases(), ids=[c[0] for c in _cases()])
async def test_run_naming_field_has_no_cross_tenant_effect(world, name, make):
    srv, sink, b = world
    stub = guard_pb2_grpc.GuardAdminStub(b.channel)
    a = await _agent(srv, "A")
    before = _snapshot(srv, sink, b)
    foreign = await make(B_RUN)(srv, stub, a)
    assert await _settled(srv, sink, b) == before, f"{name}: globex changed"
    unknown = await make(UNKNOWN)(srv, stub, a)
    assert foreign[0] == unknown[0], (name, foreign, unknown)
    assert _same_words(foreign[1], unknown[1]), (name, foreign, unknown)
    assert "globex" not in foreign[1]
    await a.close()


async def test_selectors_naming_the_other_tenant(world):
    """Cancel / ListRuns / TenantBudgets / Report by globex's tenant or agent name: refused
    or empty exactly as for a tenant or agent nobody has; globex unchanged."""
    srv, sink, b = world
    stub = guard_pb2_grpc.GuardAdminStub(b.channel)
    a = await _agent(srv, "A")
    before = _snapshot(srv, sink, b)
    pairs = [
        (
            stub.Cancel(pb.CancelRequest(selector=pb.Selector(tenant=t)), metadata=a.metadata)
            for t in ("globex", "initech")
        ),
        (
            stub.Cancel(pb.CancelRequest(selector=pb.Selector(agent=g)), metadata=a.metadata)
            for g in ("globex-bot", "no-bot")
        ),
        (
            stub.ListRuns(pb.ListRunsRequest(tenant=t), metadata=a.metadata)
            for t in ("globex", "initech")
        ),
        (
            stub.ListRuns(pb.ListRunsRequest(agent=g), metadata=a.metadata)
            for g in ("globex-bot", "no-bot")
        ),
        (
            stub.TenantBudgets(pb.TenantBudgetsRequest(tenant=t), metadata=a.metadata)
            for t in ("globex", "initech")
        ),
        (
            stub.Report(pb.ReportRequest(tenant=t), metadata=a.metadata)
            for t in ("globex", "initech")
        ),
        (
            stub.Cancel(pb.CancelRequest(selector=pb.Selector(all=True)), metadata=a.metadata)
            for _ in "ab"
        ),
    ]
    for pair in pairs:
        theirs, nobodys = [await _answer(c) for c in pair]
        assert theirs[0] == nobodys[0], (theirs, nobodys)
        assert theirs[1].replace("globex", "initech") == nobodys[1], (theirs, nobodys)
    assert await _settled(srv, sink, b) == before
    listed = await stub.ListRuns(pb.ListRunsRequest(), metadata=a.metadata)
    assert all(r.tenant == "acme" for r in listed.runs)
    await a.close()


async def test_run_started_reusing_another_tenants_live_run_id(world):
    """One id cannot name two runs, so this is the one answer that differs from an unknown
    id's (Admit): the run is denied in words that do not depend on the other tenant, the
    stream stays up, and globex's run is neither attached, charged nor told anything."""
    srv, sink, b = world
    a = await _agent(srv, "A")
    before = _snapshot(srv, sink, b)
    for restoring in (False, True):
        if restoring:
            a2 = Agent(srv.address, token="acme-secret", tenant="acme")
            await a2.connect(
                live_runs=[pb.RunStarted(run_id=B_RUN, tenant="acme")], process_id="A2"
            )
            reply = await a2.wait_for(lambda m: m.WhichOneof("body") in ("admit", "deny"))
            await a2.close()
        else:
            reply = await a.start_run(B_RUN, trace_id_of(0xA5))
        assert reply.WhichOneof("body") == "deny"
        assert reply.deny.detail == "run_id is already in use"
    await a.export(*_spend(B_RUN, trace_id_of(0xA5)))
    assert await _settled(srv, sink, b) == before
    assert srv.registry.runs[B_RUN].session.tenant == "globex"
    await a.close()
