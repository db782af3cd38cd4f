"""End to end: agent processes (the real SDK, its OTLP exporter and control stream) against
three replicas sharing a real redis-server: spans to one replica and the control stream on
another, as trace-ID load balancing does, and a fleet cancel through the third."""

from __future__ import annotations

import pytest
from server.conftest import config
from server.test_e2e_processes import AgentProc, _start, _wait_live

from guard.cli._client import AdminClient
from guard.server import MemorySink, ServerThread

pytestmark = pytest.mark.slow


def _replicas(url: str, cfg) -> tuple[dict[str, ServerThread], dict[str, MemorySink]]:
    servers, sinks = {}, {}
    for name in "xyz":
        sinks[name] = MemorySink()
        servers[name] = ServerThread(cfg, sink=sinks[name], guard_id=name, redis_url=url).start()
    return servers, sinks


def test_spans_on_one_replica_stream_on_another_and_fleet_cancel_through_a_third(
    redis_url, monkeypatch
):
    cfg = config(runs={"loop": {"window": 20, "repeat_threshold": 2, "no_progress_steps": 8}})
    servers, sinks = _replicas(redis_url, cfg)
    x, y, z = (servers[n].address for n in "xyz")
    agents: list[AgentProc] = []
    try:
        monkeypatch.setenv("OTEL_GUARD_SPAN_ENDPOINT", x)  # the collector sends spans to x
        looping = AgentProc(y, "acme", "loop", "loop-1")  # its control stream is on y
        agents.append(looping)
        _start(looping)
        (ended,) = looping.results()
        assert ended["reason"] == "loop_detected" and ended["decided_by"] == "guard", ended
        # x decided; y pushed the cancel and holds the one run record and decision record
        rid = ended["run_id"]
        assert sinks["y"].wait_for(lambda s: s.run(rid) is not None)
        assert [o.run_id for o in sinks["y"].runs] == [rid]
        assert [d.reason for d in sinks["y"].decisions if d.action == "cancel"] == ["loop_detected"]
        assert sinks["x"].runs == [] and not sinks["x"].decisions
        # idle runs with their streams on x and on y; cancelled through z
        monkeypatch.delenv("OTEL_GUARD_SPAN_ENDPOINT")
        on_x = AgentProc(x, "acme", "idle", "idle-x")
        on_y = AgentProc(y, "acme", "idle", "idle-y")
        agents += [on_x, on_y]
        _start(on_x, on_y)
        _wait_live(z, 2)  # through z: the fleet's runs
        with AdminClient(z) as admin:
            ids = admin.cancel(tenant="acme")
        ended_ids = []
        for proc, name in ((on_x, "x"), (on_y, "y")):
            (res,) = proc.results()
            ended_ids.append(res["run_id"])
            assert res["reason"] == "operator_cancel", res
            assert sinks[name].wait_for(lambda s, r=res: s.run(r["run_id"]) is not None)
        assert sorted(ids) == sorted(ended_ids)
        assert sinks["z"].runs == []
    finally:
        for a in agents:
            a.kill()
        for srv in servers.values():
            srv.stop()
