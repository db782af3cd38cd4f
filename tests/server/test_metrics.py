"""The guard's own metrics: a real guard, real control streams and OTLP exports, a real HTTP
scrape of its Prometheus endpoint and a real OTLP metrics receiver."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import grpc
import pytest
from _wait import wait_until_async

from guard.errors import ConfigError, GuardUnavailable
from guard.policy import MetricsSettings, PolicyConfig
from guard.server import GuardServer
from guard.server.runtime._metrics import OTHER_TENANTS, top_tenants

from ._metrics_help import MetricsReceiver, scrape, scrape_until
from .conftest import Agent, config, step_span, tool_span, trace_id_of

PROM = MetricsSettings(listen="127.0.0.1:0", top_tenants=1)
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


async def _loop_cancel(agent: Agent, run_id: str, tid: bytes) -> int:
    """Drive a run into loop_detected; returns the spans sent."""
    sent = 0
    for i in range(1, 8):
        await agent.export(tool_span(run_id, tid, "ab" * 16), step_span(run_id, tid, i))
        sent += 2
        if agent.directives("cancel", run_id):
            break
    await agent.wait_for(lambda m: m.WhichOneof("body") == "cancel")
    return sent


async def test_scrape_shows_spans_decisions_tenants_and_the_replica(sink):
    async with GuardServer(
        config(), listen="127.0.0.1:0", sink=sink, guard_id="replica-a", metrics=PROM
    ) as srv:
        addr = srv.metrics.address
        acme, globex = Agent(srv.address), Agent(srv.address, tenant="globex")
        await acme.connect(process_id="pa")
        await globex.connect(process_id="pg")
        await acme.start_run("a1", trace_id_of(1))
        await acme.start_run("a2", trace_id_of(2))
        await globex.start_run("g1", trace_id_of(3))
        first = await scrape(addr)
        # top_tenants=1: acme (2 runs) by name, globex summed under (other)
        assert first.value("otel_guard_runs_live", tenant="acme") == 2
        assert first.value("otel_guard_runs_live", tenant=OTHER_TENANTS) == 1
        assert first.value("otel_guard_runs_live", tenant="globex") is None
        assert first.value("otel_guard_sessions") == 2
        sent = await _loop_cancel(acme, "a1", trace_id_of(1))
        await wait_until_async(lambda: any(d.action == "cancel" for d in sink.decisions))
        await acme.end_run("a1", status="terminated", reason="loop_detected", decided_by="guard")
        bad = grpc.aio.insecure_channel(srv.address)
        with pytest.raises(grpc.aio.AioRpcError):
            await bad.unary_unary(EXPORT)(b"\xff\xff not a protobuf", timeout=5)
        await bad.close()
        got = await scrape_until(addr, lambda s: s.value("otel_guard_records_acked_total") == 1)
        assert got.value("otel_guard_spans_received_total") == sent
        assert got.value("otel_guard_spans_refused_total") == 0
        cancels = got.value(
            "otel_guard_decisions_total", action="cancel", reason="loop_detected", delivered="true"
        )
        assert cancels == 1
        assert got.value("otel_guard_decision_delivery_latency_seconds_count", action="cancel") == 1
        assert got.value("otel_guard_export_refused_total", error_type="INVALID_ARGUMENT") == 1
        assert got.value("otel_guard_records_acked_total") == 1
        assert got.value("otel_guard_runs_live", tenant="acme") == 1  # a1 ended
        assert got.value("otel_guard_loop_lag_seconds_count") > 0
        assert got.value("otel_guard_loop_lag_recent_seconds", quantile="0.99") is not None
        # every series names the replica
        labelled = [lab for name, lab, _ in got.samples if name != "target_info"]
        assert labelled and all(lab.get("guard_id") == "replica-a" for lab in labelled)
        assert got.value("target_info", guard_id="replica-a", service_name="otel-guard") == 1
        # acme's last run ends: globex takes the one labelled place, acme's series goes away
        await acme.end_run("a2")
        last = await scrape_until(
            addr, lambda s: s.value("otel_guard_runs_live", tenant="globex") == 1
        )
        assert last.value("otel_guard_runs_live", tenant="acme") is None
        assert last.value("otel_guard_runs_live", tenant=OTHER_TENANTS) == 0
        await acme.close()
        await globex.close()


async def test_otlp_export_reaches_a_receiver_with_the_same_instruments(sink):
    receiver = MetricsReceiver()
    settings = MetricsSettings(
        listen="127.0.0.1:0", otlp_endpoint=receiver.endpoint, otlp_interval_s=0.2
    )
    try:
        async with GuardServer(
            config(), listen="127.0.0.1:0", sink=sink, guard_id="replica-b", metrics=settings
        ) as srv:
            agent = Agent(srv.address)
            await agent.connect()
            await agent.start_run("r1", trace_id_of(7))
            sent = await _loop_cancel(agent, "r1", trace_id_of(7))

            def spans_and_cancel(latest) -> bool:
                spans = latest.get("otel_guard.spans.received")
                decisions = latest.get("otel_guard.decisions")
                return (
                    spans is not None
                    and spans[1].sum.data_points[0].as_int == sent
                    and decisions is not None
                )

            assert await receiver.wait_for(spans_and_cancel)
            latest = receiver.latest()
            res, decisions = latest["otel_guard.decisions"]
            assert res["guard.id"] == "replica-b" and res["service.instance.id"] == "replica-b"
            kinds = {
                tuple(kv.value.string_value for kv in p.attributes if kv.key != "delivered")
                for p in decisions.sum.data_points
            }
            assert ("cancel", "loop_detected") in kinds
            assert latest["otel_guard.runs.live"][1].gauge.data_points
            # the same instruments reach the scrape endpoint
            prom = await scrape(srv.metrics.address)
            for name in latest:
                family = name.replace(".", "_")
                assert any(f.startswith(family) for f in prom.families), name
            await agent.close()
    finally:
        receiver.stop()


async def test_redis_figures_appear_only_once_a_component_reports_them(sink):
    async with GuardServer(config(), listen="127.0.0.1:0", sink=sink, metrics=PROM) as srv:
        before = await scrape(srv.metrics.address)
        assert not any(
            n.startswith(("otel_guard_redis", "otel_guard_fail_open")) for n in before.names()
        )
        hooks = srv.metrics.redis()
        hooks.round_trip(0.0021, "evalsha")
        hooks.error("ConnectionError")
        hooks.fail_open(True)
        hooks.fail_open(True)  # still the same period
        after = await scrape(srv.metrics.address)
        assert after.value("otel_guard_redis_round_trip_seconds_count", op="evalsha") == 1
        assert after.value("otel_guard_redis_errors_total", error_type="ConnectionError") == 1
        assert after.value("otel_guard_fail_open_periods_total") == 1
        assert after.value("otel_guard_fail_open_active") == 1
        hooks.fail_open(False)
        assert (await scrape(srv.metrics.address)).value("otel_guard_fail_open_active") == 0


async def test_metrics_are_off_by_default_and_a_busy_port_stops_the_start(sink):
    async with GuardServer(config(), listen="127.0.0.1:0", sink=sink) as srv:
        assert srv.metrics is None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        srv = GuardServer(
            config(), listen="127.0.0.1:0", sink=sink, metrics=MetricsSettings(f"127.0.0.1:{port}")
        )
        with pytest.raises(GuardUnavailable, match=f"metrics endpoint 127.0.0.1:{port}"):
            await srv.start()
        assert srv._server is None  # the guard's port never started serving


def test_top_tenants_bounds_the_series():
    by_tenant = {"a": {1, 2}, "b": {3, 4}, "c": {5}, "": {6}, "gone": set()}
    assert top_tenants(by_tenant, 2) == [("a", 2), ("b", 2), (OTHER_TENANTS, 2)]
    assert top_tenants(by_tenant, 0) == [(OTHER_TENANTS, 6)]
    assert top_tenants(by_tenant, 10)[-2:] == [("c", 1), (OTHER_TENANTS, 0)]
    assert ("(none)", 1) in top_tenants(by_tenant, 10)


@pytest.mark.parametrize(
    ("metrics", "path"),
    [
        ({"listne": "127.0.0.1:9464"}, "guard.metrics.listne"),
        ({"listen": "9464"}, "guard.metrics.listen"),
        ({"listen": "host:99999"}, "guard.metrics.listen"),
        ({"otlp_endpoint": "collector:4317"}, "guard.metrics.otlp_endpoint"),
        ({"otlp_interval_s": 0}, "guard.metrics.otlp_interval_s"),
        ({"top_tenants": 5000}, "guard.metrics.top_tenants"),
        ({"top_tenants": None}, "guard.metrics.top_tenants"),
    ],
)
def test_policy_file_metrics_section_is_validated(metrics, path):
    with pytest.raises(ConfigError) as info:
        PolicyConfig.from_dict({"guard": {"metrics": metrics}})
    assert info.value.path == path


def test_policy_file_metrics_section_parses():
    cfg = PolicyConfig.from_dict(
        {"guard": {"metrics": {"listen": "[::1]:9464", "otlp_endpoint": "https://c:4317"}}}
    )
    m = cfg.guard.metrics
    assert m.enabled and m.listen == "[::1]:9464" and m.otlp_interval_s == 15.0
    assert not PolicyConfig.from_dict(None).guard.metrics.enabled


def test_serve_flags_start_the_endpoint_and_name_the_replica(tmp_path):
    """`otel-guard serve` as a process: --metrics-listen over the file, OTEL_GUARD_ID."""
    policy = tmp_path / "guard.yaml"
    policy.write_text("guard:\n  metrics:\n    listen: 127.0.0.1:1\n    top_tenants: 3\n")
    env = {**os.environ, "OTEL_GUARD_ID": "replica-env"}
    args = ["--listen", "127.0.0.1:0", "--no-store", "--config", str(policy), "--json"]
    args += ["--metrics-listen", "127.0.0.1:0", "--log-level", "WARNING"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "guard.cli", "serve", *args], stdout=subprocess.PIPE, env=env
    )
    try:
        assert proc.stdout is not None
        shown = json.loads(proc.stdout.readline())
        assert shown["guard_id"] == "replica-env"
        host, port = shown["metrics_address"].rsplit(":", 1)
        assert host == "127.0.0.1" and port != "1"  # the flag won over the file
        import urllib.request

        with urllib.request.urlopen(f"http://{shown['metrics_address']}/metrics", timeout=5) as r:
            text = r.read().decode()
        assert 'otel_guard_spans_received_total{guard_id="replica-env"} 0.0' in text
    finally:
        proc.terminate()
        proc.wait(20)
    assert proc.returncode == 0
