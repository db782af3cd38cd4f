"""End to end: real agent processes (the SDK, its real OTLP exporter and control stream)
against a real guard on 127.0.0.1:0, and the real ``otel-guard`` CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _wait import wait_until

from guard.cli._client import AdminClient
from guard.server import MemorySink, ServerThread

from .conftest import AUTH, AUTH_ENV, config

pytestmark = pytest.mark.slow
AGENT = str(Path(__file__).with_name("_agent_proc.py"))


class AgentProc:
    def __init__(
        self, endpoint: str, tenant: str, scenario: str, *runs: str, token: str | None = None
    ) -> None:
        env = dict(os.environ)
        env.pop("OTEL_GUARD_TOKEN", None)
        if token:
            env["OTEL_GUARD_TOKEN"] = token
        self.proc = subprocess.Popen(
            [sys.executable, AGENT, endpoint, tenant, scenario, *(runs or ("r",))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def ready(self) -> None:
        line = self.proc.stdout.readline()
        assert json.loads(line)["event"] == "ready", line

    def go(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def results(self, timeout: float = 30.0) -> list[dict]:
        out, _ = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0
        return [json.loads(x) for x in out.splitlines() if x.strip()]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _start(*agents: AgentProc) -> None:
    for a in agents:
        a.ready()
    for a in agents:
        a.go()


def _wait_live(address: str, n: int, timeout: float = 15.0) -> None:
    # Connected runs only: after a restart, spans that beat the Hello make a provisional
    # (listed, not yet connected) run, and the tests want the agent's re-registration.
    with AdminClient(address) as c:
        wait_until(
            lambda: sum(1 for r in c.list_runs().runs if r.connected) >= n,
            timeout,
            f"{n} connected live runs",
            interval_s=0.05,
        )


def test_loop_in_agent_process_is_stopped_by_the_guard():
    # The guard's policy is tighter than the agent's decorator (repeat_threshold 2 < 10) and
    # the SDK adopts it from the Admit; the repeats come as one parallel tool batch, which the
    # SDK judges only when it completes, so the guard sees the loop first and its cancel stops
    # the run (in flight) in the other process.
    sink = MemorySink()
    cfg = config(runs={"loop": {"window": 20, "repeat_threshold": 2, "no_progress_steps": 8}})
    with ServerThread(cfg, sink=sink) as srv:
        a = AgentProc(srv.address, "acme", "loop")
        try:
            _start(a)
            (ended,) = a.results()
        finally:
            a.kill()
        assert ended["reason"] == "loop_detected", ended
        assert ended["decided_by"] == "guard"
        assert ended["steps"] < 10
        assert sink.wait_for(lambda s: s.run(ended["run_id"]) is not None)
        assert sink.run(ended["run_id"]).decided_by.value == "guard"
        cancels = [d for d in sink.decisions if d.action == "cancel"]
        assert cancels and cancels[0].reason == "loop_detected"


def test_two_processes_share_a_tenant_budget_then_new_runs_are_denied():
    sink = MemorySink()
    tenants = {"acme": {"rolling": [{"metric": "cost_usd", "limit": 0.5, "window_s": 3600}]}}
    with ServerThread(config(tenants=tenants), sink=sink) as srv:
        a = AgentProc(srv.address, "acme", "spend")
        b = AgentProc(srv.address, "acme", "spend", "r1", "r2")  # r2 starts after the cut
        try:
            _start(a, b)
            ra, rb = a.results(), b.results()
        finally:
            a.kill()
            b.kill()
        first = [ra[0], rb[0]]
        assert {r["reason"] for r in first} == {"tenant_budget"}, first
        assert {r["decided_by"] for r in first} == {"guard"}
        assert sum(r["steps"] for r in first) <= 0.5 / 0.02 + 10  # stopped near the limit
        # r2 starts once the budget is spent or granted away: denied at admission, or (when
        # r1's unused allowance came back) stopped once the one call left is made.
        late = rb[1]
        assert late["reason"] == "tenant_budget" and late["steps"] <= 1, late
        assert sum(r["steps"] for r in [*first, late]) <= 0.5 / 0.02 + 3  # one call per run
        if late["steps"] == 0:
            assert any(d.action == "deny" and d.reason == "tenant_budget" for d in sink.decisions)


def test_cli_cancel_tenant_stops_every_process_of_that_tenant_only():
    sink = MemorySink()
    with ServerThread(config(), sink=sink) as srv:
        a = AgentProc(srv.address, "acme", "idle")
        b = AgentProc(srv.address, "acme", "idle")
        c = AgentProc(srv.address, "globex", "idle")
        try:
            _start(a, b, c)
            _wait_live(srv.address, 3)
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "guard.cli",
                    "cancel",
                    "--tenant",
                    "acme",
                    "--reason",
                    "incident",
                    "--endpoint",
                    srv.address,
                    "--json",
                ],
                capture_output=True,
                text=True,
                check=True,
                timeout=30,
            )
            assert json.loads(out.stdout)["count"] == 2
            ra, rb = a.results(), b.results()
            assert {r[0]["reason"] for r in (ra, rb)} == {"operator_cancel"}
            assert {r[0]["decided_by"] for r in (ra, rb)} == {"operator"}
            assert c.proc.poll() is None  # globex keeps running
            with AdminClient(srv.address) as client:
                live = client.list_runs()
                assert [r.tenant for r in live.runs] == ["globex"]
                client.cancel(tenant="globex")
            (rc,) = c.results()
            assert rc["reason"] == "operator_cancel"
        finally:
            for p in (a, b, c):
                p.kill()


def test_agent_process_re_registers_its_live_run_after_a_guard_restart():
    sink = MemorySink()
    first = ServerThread(config(), sink=sink).start()
    port = first.port
    a = AgentProc(first.address, "acme", "idle")
    try:
        _start(a)
        _wait_live(first.address, 1)
        first.stop(drain_s=1.0)
        with ServerThread(config(), sink=sink, listen=f"127.0.0.1:{port}") as second:
            _wait_live(second.address, 1)  # re-sent in Hello.live_runs
            run = second.call(lambda: next(iter(second.server.registry.runs.values())))
            assert run.connected and run.budget.usage().steps >= 1
            with AdminClient(second.address) as client:
                client.cancel(all=True, reason="after restart")
            (ended,) = a.results()
            assert ended["reason"] == "operator_cancel"
            assert sink.wait_for(lambda s: s.run(ended["run_id"]) is not None, timeout=10)
        assert sink.run(ended["run_id"]).decided_by.value == "operator"
    finally:
        a.kill()


def test_tenant_token_carries_spans_and_stream_end_to_end():
    # With auth on, the agent's OTLP export and control stream both present its tenant token;
    # the spend reaches the guard (the tenant budget trips) and the admin token lists runs.
    sink = MemorySink()
    tenants = {"acme": {"rolling": [{"metric": "cost_usd", "limit": 0.1, "window_s": 3600}]}}
    cfg = config(tenants=tenants, auth=AUTH)
    with ServerThread(cfg, sink=sink, environ=AUTH_ENV) as srv:
        a = AgentProc(srv.address, "acme", "spend", token=AUTH_ENV["ACME_T"])
        try:
            _start(a)
            (ended,) = a.results()
        finally:
            a.kill()
        assert ended["reason"] == "tenant_budget", ended
        assert srv.call(lambda: srv.server.registry.stats["rejected_spans"]) == 0
