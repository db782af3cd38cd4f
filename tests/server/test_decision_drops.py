"""A record sink that raises on decisions: the guard keeps deciding and delivering, counts each
lost record (``GuardAdmin.Stats`` figure ``decisions_dropped``, metric
``otel_guard.decisions.dropped``) and logs once per burst, not once per record."""

from __future__ import annotations

import logging

import grpc
from _wait import wait_until_async

from guard.policy import MetricsSettings
from guard.server import GuardServer, MemorySink
from guard.v1 import guard_pb2 as pb

from ._metrics_help import scrape
from .conftest import Agent, config, model_span, trace_id_of


class FailingSink(MemorySink):
    """A MemorySink whose decision writes raise while ``failing`` (a full disk, a dead store)."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = True
        self.refused = 0

    def write_decision(self, record):
        if self.failing:
            self.refused += 1
            raise OSError("No space left on device")
        super().write_decision(record)


async def _warn(agent: Agent, run_id: str, n: int) -> None:
    """Start ``run_id`` and cross its soft token threshold: one warn decision (acked)."""
    tid = trace_id_of(n)
    await agent.start_run(run_id, tid)
    await agent.export(model_span(run_id, tid, tokens_in=700, tokens_out=10))
    await agent.wait_for(lambda m: m.WhichOneof("body") == "warn" and m.warn.run_id == run_id)


async def test_dropped_decisions_are_counted_and_logged_once_per_burst(caplog):
    caplog.set_level(logging.WARNING, logger="guard.server.fanout")
    sink = FailingSink()
    cfg = config(runs={"max_tokens": 1000})
    prom = MetricsSettings(listen="127.0.0.1:0")
    async with GuardServer(cfg, listen="127.0.0.1:0", sink=sink, metrics=prom) as srv:
        agent = Agent(srv.address)
        await agent.connect()
        for i in range(3):
            await _warn(agent, f"r{i}", i + 1)
        # a record is written when the agent's ack arrives, after the warn reached the agent
        await wait_until_async(lambda: sink.refused == 3, 10, "3 refused decision writes")
        assert srv.registry.stats["decisions_dropped"] == 3
        ch = grpc.aio.insecure_channel(srv.address)
        stats = ch.unary_unary(
            "/guard.v1.GuardAdmin/Stats",
            request_serializer=pb.StatsRequest.SerializeToString,
            response_deserializer=pb.StatsResponse.FromString,
        )
        assert (await stats(pb.StatsRequest())).figures["decisions_dropped"] == 3
        await ch.close()
        got = await scrape(srv.metrics.address)
        assert got.value("otel_guard_decisions_dropped_total") == 3
        failed = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(failed) == 1, [r.getMessage() for r in failed]  # one burst, one line
        assert "run 'r0'" in failed[0].getMessage() and failed[0].exc_info is not None
        # the sink recovers: the next record is written and the burst is closed with its count
        sink.failing = False
        await _warn(agent, "r3", 4)
        await wait_until_async(lambda: sink.decisions, 10, "the decision written after recovery")
        assert [d.run_id for d in sink.decisions] == ["r3"]
        assert srv.registry.stats["decisions_dropped"] == 3
        recovered = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert recovered == [
            "decision sink accepts records again; 3 decision record(s) were dropped"
        ]
        await agent.close()
