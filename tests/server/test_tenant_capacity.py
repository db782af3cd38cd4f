"""At ``max_tracked_runs``: capacity is per tenant, and the answer to a span says nothing of
other tenants' run ids.

A new run (implicit, from its spans, or registered) takes the place of a span-only run: its
own tenant's stalest, or the stalest of a tenant over its share of the table when its own
tenant is within its share; a run with an agent is never displaced. Finding that run costs the same however many runs the guard
tracks (counted in calls, not timed); and a span naming another tenant's live run gets
exactly the OTLP answer, byte for byte, over gRPC and HTTP, that a span naming an id nobody
has gets.
"""

from __future__ import annotations

import sys
from typing import Any

import aiohttp
import pytest

from guard.errors import ConfigError
from guard.server import GuardServer, MemorySink, decode_request
from guard.server.control._fanout import AgentSession
from guard.server.runs._registry import Registry
from guard.server.runtime._auth import Principal
from guard.v1 import guard_pb2 as pb

from .conftest import AUTH, AUTH_ENV, Agent, config, model_span, request, span, trace_id_of

ACME = Principal(tenant="acme", admin=False)
GLOBEX = Principal(tenant="globex", admin=False)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _registry(max_runs: int, rate: float | None = None) -> tuple[Registry, Clock]:
    """A registry at ``max_runs``; ``rate``: new runs from spans per tenant per second (None:
    no limit, so that a test on a stopped clock can make as many as it needs)."""
    clock = Clock()
    settings = {"max_tracked_runs": max_runs, "max_new_span_runs_per_s": rate}
    reg = Registry(config(guard=settings), MemorySink(), guard_id="t", clock=clock)
    return reg, clock


def _send(reg: Registry, principal: Principal, *spans: Any) -> tuple[int, list[str]]:
    return reg.ingest(decode_request(request(*spans)), principal)


def _flood(reg: Registry, principal: Principal, prefix: str, n: int, batch: int = 512) -> None:
    """``n`` new implicit runs of ``principal``'s tenant, ``batch`` spans a request."""
    for lo in range(0, n, batch):
        spans = [
            model_span(f"{prefix}-{i}", trace_id_of(10_000 + i), tokens_in=1, tokens_out=0)
            for i in range(lo, min(lo + batch, n))
        ]
        _send(reg, principal, *spans)


def _calls(u: Any) -> tuple[int, int]:
    return u.model_calls, u.input_tokens + u.output_tokens


# -- no cross-tenant eviction ------------------------------------------------------------------
def test_a_flood_of_new_run_ids_never_evicts_another_tenants_run() -> None:
    reg, clock = _registry(50)
    tid = trace_id_of(1)
    for _ in range(20):
        _send(reg, ACME, model_span("acme-run", tid, tokens_in=90, tokens_out=10))
    assert _calls(reg.runs["acme-run"].budget.usage()) == (20, 2000)
    clock.t += 5.0  # acme's run is now the stalest span-only run of the guard
    _flood(reg, GLOBEX, "g", 400)
    assert len(reg.runs) <= 50
    run = reg.runs["acme-run"]  # not evicted ...
    _send(reg, ACME, model_span("acme-run", tid, tokens_in=90, tokens_out=10))
    assert run is reg.runs["acme-run"]  # ... nor restarted by its next span
    assert _calls(run.budget.usage()) == (21, 2100)
    # globex made room among its own runs only: its newest are tracked, its oldest forgotten
    assert "g-399" in reg.runs and "g-0" not in reg.runs
    assert all(r.tenant == "globex" for r in reg.span_only.values() if r is not run)


def test_a_registration_at_the_cap_makes_room_only_among_its_own_tenant() -> None:
    reg, clock = _registry(3)
    _send(reg, ACME, model_span("acme-run", trace_id_of(1)))
    _send(reg, GLOBEX, model_span("g-old", trace_id_of(2)))
    clock.t += 1.0
    _send(reg, GLOBEX, model_span("g-new", trace_id_of(3)))  # full now
    session = AgentSession("s", None, reg.log, reg.clock)
    reg.hello(session, pb.Hello(process_id="p", tenant="globex"), GLOBEX)
    rs = pb.RunStarted(run_id="g-reg", trace_id=trace_id_of(4).hex(), tenant="globex")
    reg.register(session, rs, GLOBEX)
    assert "g-reg" in reg.runs and "acme-run" in reg.runs
    assert "g-old" not in reg.runs and "g-new" in reg.runs  # globex's stalest made room
    reg.register(session, pb.RunStarted(run_id="g-reg2", tenant="globex"), GLOBEX)
    assert "g-reg2" in reg.runs and "g-new" not in reg.runs  # globex's last span-only run
    # globex, with no span-only run left, is refused at the cap: not given acme's room
    reg.register(session, pb.RunStarted(run_id="g-reg3", tenant="globex"), GLOBEX)
    assert "g-reg3" not in reg.runs and "acme-run" in reg.runs
    assert reg.stats["capacity_rejections"] == 1


def test_a_flood_cannot_lock_another_tenant_out_of_a_full_table() -> None:
    reg, clock = _registry(10)
    _flood(reg, GLOBEX, "g", 10)  # globex fills the table with span-only runs
    clock.t += 1.0
    session = AgentSession("s", None, reg.log, reg.clock)
    reg.hello(session, pb.Hello(process_id="p", tenant="acme"), ACME)
    for i in range(5):  # acme's share: 10 runs over 2 tenants
        reg.register(session, pb.RunStarted(run_id=f"a-{i}", tenant="acme"), ACME)
    assert all(f"a-{i}" in reg.runs for i in range(5))
    assert reg.stats["capacity_rejections"] == 0
    assert sorted(r for r in reg.runs if r.startswith("g")) == [f"g-{i}" for i in range(5, 10)]
    # at its share, acme makes room only among its own span-only runs (it has none) ...
    reg.register(session, pb.RunStarted(run_id="a-5", tenant="acme"), ACME)
    assert "a-5" not in reg.runs and reg.stats["capacity_rejections"] == 1
    # ... and globex, now within its share, keeps the rest: its new runs take its own room
    _flood(reg, GLOBEX, "h", 3)
    assert all(f"a-{i}" in reg.runs for i in range(5)) and len(reg.runs) == 10
    assert "h-2" in reg.runs and "g-5" not in reg.runs


def test_a_run_with_an_agent_is_never_displaced() -> None:
    reg, _ = _registry(4)
    session = AgentSession("s", None, reg.log, reg.clock)
    reg.hello(session, pb.Hello(process_id="p", tenant="globex"), GLOBEX)
    for i in range(4):
        reg.register(session, pb.RunStarted(run_id=f"g-{i}", tenant="globex"), GLOBEX)
    # globex holds the whole table, but with registered runs: acme gets no room
    assert _send(reg, ACME, model_span("a-1", trace_id_of(1)))[0] == 1
    assert "a-1" not in reg.runs and all(f"g-{i}" in reg.runs for i in range(4))


def test_the_run_forgotten_at_the_cap_is_the_tenants_least_recently_heard_from() -> None:
    reg, clock = _registry(3)
    for i, rid in enumerate(("a-1", "a-2", "a-3")):
        clock.t += 1.0
        _send(reg, ACME, model_span(rid, trace_id_of(i + 1)))
    clock.t += 1.0
    _send(reg, ACME, model_span("a-1", trace_id_of(1)))  # heard from again: now a-2 is stalest
    _send(reg, ACME, model_span("a-4", trace_id_of(4)))
    assert sorted(reg.runs) == ["a-1", "a-3", "a-4"]


def test_runs_made_from_spans_are_limited_per_tenant_per_second() -> None:
    reg, clock = _registry(100_000, rate=100.0)
    _flood(reg, GLOBEX, "g", 500)  # one burst: a second's worth is made, the rest refused
    assert sum(r.startswith("g-") for r in reg.runs) == 100
    assert reg.stats["span_runs_rate_limited"] == 400
    # a known run's spans are never limited, and another tenant has its own rate
    assert _send(reg, GLOBEX, model_span("g-0", trace_id_of(10_000)))[0] == 0
    assert _send(reg, ACME, model_span("a-1", trace_id_of(1)))[0] == 0
    clock.t += 0.5  # half a second later: half a second's worth more
    _flood(reg, GLOBEX, "h", 100)
    assert sum(r.startswith("h-") for r in reg.runs) == 50
    # a refused span is answered as one naming another tenant's run (no oracle)
    rejected, errors = _send(reg, GLOBEX, model_span("a-1", trace_id_of(1)))
    assert rejected == 1 and "not admitted" in errors[0]


def test_the_rate_of_new_runs_is_a_validated_setting() -> None:
    assert config().guard.max_new_span_runs_per_s == 1000.0
    assert config(guard={"max_new_span_runs_per_s": None}).guard.max_new_span_runs_per_s is None
    with pytest.raises(ConfigError, match="max_new_span_runs_per_s"):
        config(guard={"max_new_span_runs_per_s": 0})


# -- the work of making room ------------------------------------------------------------------
def _python_calls(fn: Any) -> int:
    """How many functions (Python and builtin) ``fn()`` calls: the work it does, untimed."""
    n = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal n
        if event in ("call", "c_call"):
            n += 1

    sys.setprofile(count)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return n


def _work_at_the_cap(tracked: int) -> int:
    """Calls made by one request of one new implicit run at the cap of ``tracked`` span-only
    runs (the run it makes room from included)."""
    reg, clock = _registry(tracked)
    _flood(reg, ACME, "a", tracked)
    assert len(reg.span_only) == tracked
    clock.t += 1.0
    _send(reg, ACME, model_span("warm", trace_id_of(1)))  # first-call effects out of the count
    work = _python_calls(lambda: _send(reg, ACME, model_span("new", trace_id_of(2))))
    assert "new" in reg.runs and "a-1" not in reg.runs and len(reg.runs) == tracked
    return work


def test_making_room_costs_the_same_at_1k_and_10k_tracked_runs() -> None:
    small, large = _work_at_the_cap(1_000), _work_at_the_cap(10_000)
    # a scan of the span-only runs would make ~9,000 more calls (one key per run) at 10k
    assert large <= small + 10, (small, large)


def _sweep_work(tracked: int) -> int:
    """Calls made by one sweep of ``tracked`` span-only runs, all heard from just now."""
    reg, _clock = _registry(tracked + 10)
    _flood(reg, ACME, "a", tracked)
    reg.lifecycle.sweep()  # first-call effects out of the count
    return _python_calls(reg.lifecycle.sweep)


def test_a_sweep_costs_the_same_at_1k_and_10k_fresh_span_only_runs() -> None:
    small, large = _sweep_work(1_000), _sweep_work(10_000)
    # a scan of the span-only runs (twice, as before) makes ~18,000 more calls at 10k
    assert large <= small + 10, (small, large)


def test_the_sweep_ends_exactly_the_idle_span_only_runs_from_each_tenants_stalest() -> None:
    from guard.server.runs._lifecycle import SPAN_ONLY_IDLE_S

    reg, clock = _registry(100)
    for i in range(6):
        clock.t += 1.0
        _send(reg, ACME, model_span(f"a-{i}", trace_id_of(100 + i)))
        _send(reg, GLOBEX, model_span(f"g-{i}", trace_id_of(200 + i)))
    clock.t += 1.0
    _send(reg, ACME, model_span("a-0", trace_id_of(100)))  # heard from again: fresh
    clock.t += SPAN_ONLY_IDLE_S - 2.5  # a-1..a-3 and g-0..g-3 are past the idle time
    while reg.lifecycle.sweep(limit=1):  # in slices: what is left comes on the next call
        pass
    assert sorted(reg.span_only) == ["a-0", "a-4", "a-5", "g-4", "g-5"]


# -- one answer for unknown and foreign run ids ---------------------------------------------
def _claiming(run_id: str, tenant: str) -> Any:
    return model_span(run_id, trace_id_of(40), **{"guard.tenant": tenant})


def _run_span(run_id: str) -> Any:
    attrs = {
        "guard.run.id": run_id,
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "bot",
        "guard.stop.status": "completed",
        "guard.stop.reason": "final_answer",
    }
    return span("invoke_agent bot", trace_id_of(41), attrs)


async def _answers(acme_run: str, probe: str) -> list[bytes]:
    """globex's OTLP answers (gRPC response bytes, HTTP protobuf body) to spans naming
    ``probe`` on a guard where acme's live run is ``acme_run``: below the cap, then at the
    cap with a span-only run of acme's (none of globex's, which holds its share of the table),
    then with no span-only run."""
    cfg = config(auth=AUTH, guard={"max_tracked_runs": 4})
    async with GuardServer(
        cfg, listen="127.0.0.1:0", sink=MemorySink(), environ=AUTH_ENV, http_listen="127.0.0.1:0"
    ) as srv:
        acme = Agent(srv.address, token="acme-secret", tenant="acme")
        await acme.connect()
        await acme.start_run(acme_run, trace_id_of(2))
        globex = Agent(srv.address, token="globex-secret", tenant="globex")
        await globex.connect(process_id="g")
        await globex.start_run("g1", trace_id_of(3))
        await globex.start_run("g2", trace_id_of(4))
        export = globex.channel.unary_unary(
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
        )  # no deserializer: the response's bytes as sent
        url = f"http://{srv.http.address}/v1/traces"
        headers = {
            "Content-Type": "application/x-protobuf",
            "Authorization": "Bearer globex-secret",
        }
        out: list[bytes] = []

        async def ask(*spans: Any) -> None:
            body = request(*spans).SerializeToString()
            out.append(await export(body, metadata=globex.metadata))
            async with aiohttp.ClientSession() as s, s.post(url, data=body, headers=headers) as r:
                assert r.status == 200
                out.append(await r.read())

        await ask(_claiming(probe, "acme"), model_span("g1", trace_id_of(3)))
        await acme.export(model_span("acme-only", trace_id_of(5)))  # the cap: 4 runs
        await ask(model_span(probe, trace_id_of(40)), _run_span(probe))
        await acme.export(_run_span("acme-only"))  # ended: below the cap again ...
        await acme.start_run("a-3", trace_id_of(6))  # ... and at it, with no span-only run
        await ask(_run_span(probe), model_span(probe, trace_id_of(40)), _claiming(probe, "acme"))
        assert srv.registry.runs[acme_run].budget.usage().model_calls == 0
        await globex.close()
        await acme.close()
        return out


async def test_a_foreign_run_id_gets_the_answer_of_an_unknown_one_byte_for_byte() -> None:
    foreign = await _answers("a1", "a1")  # globex names acme's live run
    unknown = await _answers("a9", "a1")  # the same spans, naming an id nobody has
    assert foreign == unknown
    assert any(foreign)  # refusals included (partial_success), not only empty answers
    assert foreign[0::2] == foreign[1::2]  # gRPC and HTTP agree
