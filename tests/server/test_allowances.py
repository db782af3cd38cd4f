"""The guard's tenant allowances over a real control stream: grant with the Admit, answer
requests, never grant more than the windows have left, release on every way out, and count
spans that arrive after their run ended."""

from __future__ import annotations

import pytest
from _wait import wait_until_async

from guard.server import GuardServer
from guard.v1 import guard_pb2 as pb

from .conftest import AUTH, AUTH_ENV, Agent, config, model_span, trace_id_of

TENANTS = {"acme": {"rolling": [{"metric": "cost_usd", "limit": 1.0, "window_s": 3600}]}}


def _allowances(agent: Agent, run_id: str) -> list[pb.Allowance]:
    return [
        m.allowance
        for m in agent.messages
        if m.WhichOneof("body") == "allowance" and m.allowance.run_id == run_id
    ]


async def _request(agent: Agent, run_id: str, rid: int, cost_usd: float) -> pb.Allowance:
    req = pb.AllowanceRequest(run_id=run_id, request_id=rid, cost_usd=cost_usd)
    await agent.outbox.put(pb.AgentMessage(allowance_request=req))
    msg = await agent.wait_for(
        lambda m: m.WhichOneof("body") == "allowance" and m.allowance.request_id == rid
    )
    return msg.allowance


@pytest.fixture
async def srv(sink):
    cfg = config(tenants=TENANTS)
    async with GuardServer(cfg, listen="127.0.0.1:0", sink=sink) as s:
        yield s


async def test_the_admit_brings_the_ceilings_and_requests_get_exactly_their_need(srv):
    a = Agent(srv.address)
    await a.connect()
    try:
        admit = await a.start_run("r1", trace_id_of(1))
        assert admit.WhichOneof("body") == "admit"
        first = next(  # the allowance arrives before the Admit it goes with
            i for i, m in enumerate(a.messages) if m.WhichOneof("body") == "allowance"
        )
        assert first < a.messages.index(admit)
        (al,) = _allowances(a, "r1")
        # nothing is lent ahead of a call: the ceiling is what the run spent (nothing)
        assert al.HasField("max_cost_usd") and al.max_cost_usd == 0.0
        assert not al.HasField("max_tokens") and al.ttl_s > 0 and not al.exhausted
        await a.start_run("r2", trace_id_of(2))
        assert (await _request(a, "r2", 6, 0.1)).max_cost_usd == pytest.approx(0.1)
        got = await _request(a, "r1", 7, 0.8)
        assert got.max_cost_usd == pytest.approx(0.8) and not got.exhausted
        led = srv.registry.budgets.allowances.ledger("acme")
        assert led.outstanding()[0] == pytest.approx(0.9)
        over = await _request(a, "r2", 8, 0.2)  # 0.1 left to grant
        assert over.exhausted and "0.1 left to grant" in over.detail
        assert "reserved by runs in flight 0.9)" in over.detail, over.detail
        assert over.max_cost_usd == pytest.approx(0.1)  # unchanged
        assert led.outstanding()[0] == pytest.approx(0.9)  # nothing changed
    finally:
        await a.close()


async def test_spend_moves_into_the_window_and_every_way_out_releases(srv):
    a = Agent(srv.address)
    await a.connect()
    led = srv.registry.budgets.allowances.ledger("acme")
    try:
        await a.start_run("r1", trace_id_of(1))
        await _request(a, "r1", 1, 0.5)  # ceiling 0.5
        await a.export(model_span("r1", trace_id_of(1), **{"guard.cost.usd": 0.3}))
        # applied by the next refresh (sweep, grant or release), not on the ingest path
        await wait_until_async(lambda: abs(led.outstanding()[0] - 0.2) < 1e-9)
        await a.end_run("r1", usage=pb.Usage(cost_usd=0.3))
        await wait_until_async(lambda: "r1" not in srv.registry.runs)
        assert led.outstanding()[0] == pytest.approx(0.0) and "r1" not in led
        # agent_lost: the stream drops and the grace period passes
        await a.start_run("r2", trace_id_of(2))
        await _request(a, "r2", 2, 0.4)
        assert led.outstanding()[0] == pytest.approx(0.4)
    finally:
        await a.close()
    srv.registry.grace_s = 0.0
    await wait_until_async(lambda: "r2" not in srv.registry.runs, 5)
    assert led.outstanding()[0] == pytest.approx(0.0)


async def test_spans_after_the_run_ended_still_count_and_consume_its_tail(srv):
    a = Agent(srv.address)
    await a.connect()
    led = srv.registry.budgets.allowances.ledger("acme")
    tb = srv.registry.budgets.budget("acme")
    try:
        await a.start_run("r1", trace_id_of(1))
        await _request(a, "r1", 1, 0.4)
        await a.export(model_span("r1", trace_id_of(1), **{"guard.cost.usd": 0.1}))
        # The agent says it spent 0.3: 0.2 is still on its way (held as the run's tail).
        await a.end_run("r1", usage=pb.Usage(cost_usd=0.3))
        await wait_until_async(lambda: "r1" not in srv.registry.runs)
        assert led.outstanding()[0] == pytest.approx(0.2)
        await a.export(model_span("r1", trace_id_of(1), **{"guard.cost.usd": 0.2}))
        assert tb.status(srv.registry.clock())[0][2] == pytest.approx(0.3)  # all of it counted
        assert led.outstanding()[0] == pytest.approx(0.0)
        assert srv.registry.stats["late_counted"] == 1
    finally:
        await a.close()


async def test_unknown_runs_and_bad_requests(srv):
    a = Agent(srv.address)
    await a.connect()
    try:
        got = await _request(a, "nope", 3, 0.1)
        assert got.ttl_s == 0 and not got.HasField("max_cost_usd")  # fall back to local
        req = pb.AllowanceRequest(run_id="x", request_id=4, cost_usd=float("nan"))
        await a.outbox.put(pb.AgentMessage(allowance_request=req))
        got = await a.wait_for(lambda m: m.WhichOneof("body") == "reject", timeout=5)
        assert got.reject.request_id == 4 and "cost_usd" in got.reject.reason
        assert a.error is None  # refused on its own: the stream goes on
    finally:
        await a.close()


async def test_another_tenants_run_is_answered_like_an_unknown_one(sink, monkeypatch):
    for k, v in AUTH_ENV.items():
        monkeypatch.setenv(k, v)
    tenants = {**TENANTS, "globex": TENANTS["acme"]}
    async with GuardServer(
        config(tenants=tenants, auth=AUTH), listen="127.0.0.1:0", sink=sink
    ) as s:
        acme = Agent(s.address, token="acme-secret")
        globex = Agent(s.address, token="globex-secret", tenant="globex")
        await acme.connect()
        await globex.connect()
        try:
            await acme.start_run("a1", trace_id_of(1))
            led = s.registry.budgets.allowances.ledger("acme")
            before = led.outstanding()
            got = await _request(globex, "a1", 5, 0.5)
            unknown = await _request(globex, "nope", 6, 0.5)
            assert (got.ttl_s, got.HasField("max_cost_usd")) == (0, False)
            assert got.exhausted == unknown.exhausted and got.detail == unknown.detail == ""
            assert led.outstanding() == before
        finally:
            await acme.close()
            await globex.close()
