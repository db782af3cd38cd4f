"""Agent clocks, against a real guard on 127.0.0.1:0: the Hello's ``agent_time_unix`` gives
the skew the guard sees per agent session (a session attribute, GuardAdmin.Stats, the
metrics, one WARNING per session beyond 5 minutes), and an agent a day ahead or ten years
behind is guarded like any other: its runs are admitted (their start put on the guard's
clock, so a re-registered run's deadline is not eaten), its records stored and flagged."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from _wait import wait_until_async

from guard.policy import MetricsSettings
from guard.server import GuardServer
from guard.v1 import guard_pb2 as pb
from guard.v1 import guard_pb2_grpc

from ._metrics_help import scrape
from .conftest import Agent, config, trace_id_of

DAY_S = 86_400.0
AHEAD = 25 * 3600.0
BEHIND = -10 * 365.25 * DAY_S


async def _connect(agent: Agent, skew_s: float | None, process_id: str = "p1", live=()) -> None:
    """``Agent.connect`` with the Hello carrying an agent clock ``skew_s`` off."""
    agent.call = agent.stub.Attach(agent._requests(), metadata=agent.metadata)
    hello = pb.Hello(process_id=process_id, tenant=agent.tenant, live_runs=list(live))
    if skew_s is not None:
        hello.agent_time_unix = time.time() + skew_s
    await agent.outbox.put(pb.AgentMessage(hello=hello))
    agent.task = asyncio.ensure_future(agent._read())
    await agent.wait_for(lambda m: m.WhichOneof("body") == "welcome")


async def _stats(address: str) -> dict[str, float]:
    import grpc

    async with grpc.aio.insecure_channel(address) as ch:
        resp = await guard_pb2_grpc.GuardAdminStub(ch).Stats(pb.StatsRequest())
    return dict(resp.figures)


def _session(srv: GuardServer):
    [session] = list(srv.registry.sessions)
    return session


@pytest.mark.parametrize("skew", [AHEAD, BEHIND], ids=["ahead-25h", "behind-10y"])
async def test_a_skewed_agent_is_measured_once_and_guarded(guard, sink, skew, caplog):
    caplog.set_level(logging.WARNING, logger="guard.server")
    agent = Agent(guard.address)
    await _connect(agent, skew, process_id="skewed-proc")
    assert _session(guard).clock_skew_s == pytest.approx(skew, abs=5)
    # its runs start on its clock: admitted, with the guard's time as their start
    now_agent = time.time() + skew
    answer = await agent.start_run("r1", trace_id_of(1), started_at_unix=now_agent)
    assert answer.WhichOneof("body") == "admit"
    assert guard.registry.runs["r1"].started_at == pytest.approx(time.time(), abs=5)
    # its record is stored with the guard's receive time, flagged
    await agent.end_run("r1", started_at_unix=now_agent, ended_at_unix=now_agent + 1)
    await wait_until_async(lambda: sink.run("r1") is not None, what="the record")
    record = sink.run("r1")
    assert abs(record.ended_at - time.time()) < 5 and "agent clock out of bounds" in record.message
    figures = await _stats(guard.address)
    assert figures["clock_skew_live_max_abs_s"] == pytest.approx(abs(skew), abs=5)
    assert figures["sessions_clock_skewed_live"] == 1.0
    assert figures["sessions_clock_skewed"] == 1.0 and figures["runs_clock_mended"] >= 1
    warned = [r for r in caplog.records if "skewed-proc" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    assert f"{skew:+.0f} s" in warned[0].getMessage()
    assert not [m for m in agent.messages if m.WhichOneof("body") == "reject"]
    await agent.close()


@pytest.mark.parametrize("skew", [AHEAD, BEHIND], ids=["ahead-25h", "behind-10y"])
async def test_a_skewed_agent_reconnects_with_its_live_runs_and_keeps_its_deadline(guard, skew):
    """The Hello re-registering a run started 10 s ago on the agent's clock: admitted (not the
    whole Hello refused), and its deadline resumes 10 s in, not 10 years or -25 h."""
    started = time.time() + skew - 10.0
    live = pb.RunStarted(
        run_id="live1",
        trace_id=trace_id_of(2).hex(),
        tenant="acme",
        started_at_unix=started,
        requested=pb.Limits(deadline_s=600.0),
        usage=pb.Usage(steps=1),
    )
    agent = Agent(guard.address)
    await _connect(agent, skew, live=[live])
    await agent.wait_for(lambda m: m.WhichOneof("body") == "admit" and m.admit.run_id == "live1")
    run = guard.registry.runs["live1"]
    assert run.started_at == pytest.approx(time.time() - 10.0, abs=5)
    assert run.stop_reason is None and agent.error is None
    assert not [m for m in agent.messages if m.WhichOneof("body") in ("cancel", "reject")]
    await agent.close()


async def test_a_small_skew_is_recorded_and_changes_nothing(guard, caplog):
    caplog.set_level(logging.WARNING, logger="guard.server")
    agent = Agent(guard.address)
    await _connect(agent, 20.0)
    assert _session(guard).clock_skew_s == pytest.approx(20.0, abs=5)
    started = time.time() + 20.0
    await agent.start_run("r1", trace_id_of(1), started_at_unix=started)
    assert guard.registry.runs["r1"].started_at == started  # within bounds: as sent
    figures = await _stats(guard.address)
    assert figures["sessions_clock_skewed_live"] == 0.0
    assert "sessions_clock_skewed" not in figures
    assert not [r for r in caplog.records if "wall clock" in r.getMessage()]
    await agent.close()


async def test_an_agent_that_says_nothing_of_its_clock_has_no_skew(guard):
    agent = Agent(guard.address)
    await _connect(agent, None)
    assert _session(guard).clock_skew_s is None
    assert (await _stats(guard.address))["clock_skew_live_max_abs_s"] == 0.0
    await agent.close()


async def test_the_skew_is_a_prometheus_gauge(sink):
    prom = MetricsSettings(listen="127.0.0.1:0")
    async with GuardServer(config(), listen="127.0.0.1:0", sink=sink, metrics=prom) as srv:
        a, b = Agent(srv.address), Agent(srv.address)
        await _connect(a, AHEAD, process_id="a")
        await _connect(b, -2.0, process_id="b")
        got = await scrape(srv.metrics.address)
        assert got.value("otel_guard_agent_clock_skew_max_seconds") == pytest.approx(AHEAD, abs=5)
        assert got.value("otel_guard_agent_clock_skewed_sessions") == 1.0
        await a.close()
        await b.close()
