"""The guard's half of "nothing acknowledged is lost": a RunEnded whose record the sink
could not make durable (the store's disk is full) is not acknowledged; the run is ended all
the same; the record is offered again and acknowledged once the sink takes it; a resend of
it is the same record (one row); and health/Stats/metrics report the condition."""

from __future__ import annotations

import asyncio
import time

import grpc
from _wait import wait_until_async
from grpc_health.v1 import health_pb2, health_pb2_grpc

from guard.errors import StoreError
from guard.server import GuardServer, MemorySink
from guard.v1 import guard_pb2 as pb
from guard.v1 import guard_pb2_grpc

from .conftest import Agent, config, trace_id_of


class FullDiskSink(MemorySink):
    """A MemorySink whose ``write_run`` refuses like the store on a full disk."""

    def __init__(self) -> None:
        super().__init__()
        self.full = False
        self.refusals = 0

    @property
    def disk_full(self) -> bool:
        return self.full

    def write_run(self, outcome):
        if self.full:
            self.refusals += 1
            raise StoreError("WAL append failed: [Errno 28] No space left on device")
        super().write_run(outcome)

    def counters(self) -> dict[str, int]:
        return {"disk_full": int(self.full), "held": 0, "refused": self.refusals}


def _acks(agent: Agent, run_id: str) -> int:
    return sum(
        1
        for m in agent.messages
        if m.WhichOneof("body") == "record_ack" and m.record_ack.run_id == run_id
    )


async def _health(address: str, service: str = "") -> int:
    async with grpc.aio.insecure_channel(address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        return (await stub.Check(health_pb2.HealthCheckRequest(service=service))).status


async def test_record_not_durable_is_not_acked_then_retried_and_acked_once():
    sink = FullDiskSink()
    async with GuardServer(config(), listen="127.0.0.1:0", sink=sink) as srv:
        agent = Agent(srv.address)
        await agent.connect()
        await agent.start_run("r1", trace_id_of(1))
        await agent.start_run("r2", trace_id_of(2))
        sink.full = True
        now = time.time()
        kw = {"decided_by": "sdk", "started_at_unix": now - 1, "ended_at_unix": now}
        await agent.end_run("r1", status="terminated", reason="max_steps", **kw)
        await wait_until_async(lambda: "r1" in srv.registry.ended, 5, "r1 ended")
        # the run is over on the guard (not live, its slot back), but nothing is acknowledged
        assert "r1" not in srv.registry.runs
        assert sink.refusals >= 1
        await wait_until_async(lambda: srv.readiness.ready is False, 5, "not ready")
        assert await _health(srv.address) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert (
            await _health(srv.address, "guard.v1.GuardControl")
            == health_pb2.HealthCheckResponse.NOT_SERVING
        )
        assert (
            await _health(srv.address, "guard.v1.GuardAdmin")
            == health_pb2.HealthCheckResponse.SERVING
        )
        async with grpc.aio.insecure_channel(srv.address) as ch:
            stats = await guard_pb2_grpc.GuardAdminStub(ch).Stats(pb.StatsRequest())
        figures = stats.figures
        assert figures["records_unacked"] >= 1 and figures["records_unwritten"] == 1
        assert figures["store_disk_full"] == 1
        # the agent resends it meanwhile (as after a reconnect): still not durable, not acked
        await agent.end_run("r1", status="terminated", reason="max_steps", **kw)
        await asyncio.sleep(1.0)
        assert _acks(agent, "r1") == 0 and sink.runs == []
        # the disk has room again: the sweep writes it and acks it on its stream, once
        sink.full = False
        await agent.wait_for(
            lambda m: m.WhichOneof("body") == "record_ack" and m.record_ack.run_id == "r1", 10
        )
        await wait_until_async(lambda: srv.readiness.ready, 5, "ready again")
        assert await _health(srv.address) == health_pb2.HealthCheckResponse.SERVING
        # a later resend is a repeat: acked, nothing written
        await agent.end_run("r1", status="terminated", reason="max_steps", **kw)
        await agent.end_run("r2", status="completed", reason="final_answer", **kw)
        await agent.wait_for(
            lambda m: m.WhichOneof("body") == "record_ack" and m.record_ack.run_id == "r2", 5
        )
        await wait_until_async(lambda: _acks(agent, "r1") == 2, 5, "the repeat acked")
        assert [o.run_id for o in sink.runs] == ["r1", "r2"]
        assert sink.runs[0].reason.value == "max_steps"
        assert not srv.registry.lifecycle.unwritten
        await agent.close()


async def test_the_guards_own_record_is_kept_and_written_once_space_returns():
    sink = FullDiskSink()
    cfg = config(guard={"agent_grace_s": 0.2})
    async with GuardServer(cfg, listen="127.0.0.1:0", sink=sink) as srv:
        agent = Agent(srv.address)
        await agent.connect()
        await agent.start_run("lost1", trace_id_of(3))
        sink.full = True
        await agent.close()  # the agent is gone: agent_lost after the grace, by the guard
        await wait_until_async(lambda: "lost1" in srv.registry.ended, 10, "agent_lost")
        assert sink.runs == [] and "lost1" in srv.registry.lifecycle.unwritten
        sink.full = False
        await wait_until_async(lambda: len(sink.runs) == 1, 10, "written after all")
        assert sink.runs[0].reason.value == "agent_lost"
        await asyncio.sleep(0.5)
        assert len(sink.runs) == 1


async def test_the_condition_is_on_the_metrics_endpoint():
    from guard.policy import MetricsSettings

    from ._metrics_help import scrape_until

    sink = FullDiskSink()
    prom = MetricsSettings(listen="127.0.0.1:0")
    async with GuardServer(config(), listen="127.0.0.1:0", sink=sink, metrics=prom) as srv:
        agent = Agent(srv.address)
        await agent.connect()
        await agent.start_run("m1", trace_id_of(4))
        sink.full = True
        await agent.end_run("m1", status="completed", reason="final_answer")
        # the gauge follows the sink at once, the refused ack the record's arrival: wait for both
        got = await scrape_until(
            srv.metrics.address,
            lambda s: (
                s.value("otel_guard_store_disk_full") == 1
                and (s.value("otel_guard_records_unacked_total") or 0) >= 1
            ),
        )
        assert got.value("otel_guard_records_acked_total") in (None, 0)
        sink.full = False
        got = await scrape_until(
            srv.metrics.address, lambda s: s.value("otel_guard_records_acked_total") == 1
        )
        assert got.value("otel_guard_store_disk_full") == 0
        await agent.close()


async def test_past_the_bound_an_agent_record_is_let_go_unacked_and_its_resend_is_written(
    monkeypatch,
):
    from guard.server.runs import _lifecycle

    monkeypatch.setattr(_lifecycle, "UNWRITTEN_MAX", 2)
    sink = FullDiskSink()
    async with GuardServer(config(), listen="127.0.0.1:0", sink=sink) as srv:
        agent = Agent(srv.address)
        await agent.connect()
        for i in range(3):
            await agent.start_run(f"b{i}", trace_id_of(10 + i))
        sink.full = True
        for i in range(3):
            await agent.end_run(f"b{i}", status="completed", reason="final_answer")
        life = srv.registry.lifecycle
        await wait_until_async(lambda: "b2" in life.unwritten, 5, "all three refused")
        assert list(life.unwritten) == ["b1", "b2"]  # b0 let go: never acked, not "ended"
        assert "b0" not in srv.registry.ended
        sink.full = False
        await agent.end_run("b0", status="completed", reason="final_answer")  # the resend
        for rid in ("b0", "b1", "b2"):
            await agent.wait_for(
                lambda m, rid=rid: (
                    m.WhichOneof("body") == "record_ack" and m.record_ack.run_id == rid
                ),
                10,
            )
        assert sorted(o.run_id for o in sink.runs) == ["b0", "b1", "b2"]
        await agent.close()
