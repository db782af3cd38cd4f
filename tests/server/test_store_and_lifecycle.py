"""The guard with the real embedded store, health and reflection, and SIGTERM drain."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time

import grpc
from _wait import wait_until_async
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from guard.cli._client import AdminClient
from guard.server import GuardServer

from .conftest import Agent, config, trace_id_of


async def test_report_reads_the_attached_store(tmp_path):
    from guard.store import open_store

    store = open_store(None, data_dir=tmp_path)
    try:
        async with GuardServer(config(), listen="127.0.0.1:0", sink=store) as srv:
            agent = Agent(srv.address)
            await agent.connect()
            await agent.start_run("s1", trace_id_of(1))
            await agent.end_run(
                "s1",
                status="terminated",
                reason="max_steps",
                decided_by="sdk",
                started_at_unix=time.time() - 1,
                ended_at_unix=time.time(),
            )
            await wait_until_async(lambda: "s1" in srv.registry.ended, 10, "s1's end applied")
            await asyncio.to_thread(store.flush, 10.0)
            with AdminClient(srv.address) as c:
                report = await asyncio.to_thread(c.report)
            assert [(r.status, r.reason, r.runs) for r in report.rows] == [
                ("terminated", "max_steps", 1)
            ]
            await agent.close()
    finally:
        store.close()


async def test_health_and_reflection(guard):
    ch = grpc.aio.insecure_channel(guard.address)
    health = health_pb2_grpc.HealthStub(ch)
    for service in ("", "guard.v1.GuardControl", "guard.v1.GuardAdmin"):
        resp = await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(ch)

    async def ask():
        yield reflection_pb2.ServerReflectionRequest(list_services="")

    async for resp in refl.ServerReflectionInfo(ask()):
        names = {s.name for s in resp.list_services_response.service}
        break
    assert {
        "guard.v1.GuardControl",
        "guard.v1.GuardAdmin",
        "opentelemetry.proto.collector.trace.v1.TraceService",
        "grpc.health.v1.Health",
    } <= names
    await ch.close()


def test_serve_prints_address_and_drains_on_sigterm(tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "guard.cli",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--no-store",
            "--json",
            "--drain-s",
            "60",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        info = json.loads(proc.stdout.readline())
        with AdminClient(info["address"]) as c:
            assert c.list_runs().total == 0
        proc.send_signal(signal.SIGTERM)
        # nothing in flight: the drain ends at once, not at its 60 s bound (the wait is shorter)
        assert proc.wait(30) == 0
        assert "draining" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_serve_rejects_bad_policy_file(tmp_path):
    bad = tmp_path / "guard.yaml"
    bad.write_text("runs:\n  max_stepz: 3\n")
    out = subprocess.run(
        [sys.executable, "-m", "guard.cli", "serve", "--config", str(bad), "--no-store"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2
    assert "max_stepz" in out.stderr
