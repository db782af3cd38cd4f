"""Runs the demo: a guard with the embedded ClickHouse, a fleet of agent processes, the live
view, a mid-demo operator cancel, and the read-back from ClickHouse.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from guard.demo._fleet import (
    BUDGET_TENANT,
    BUDGET_TENANT_LIMIT_USD,
    CANCEL_TENANT,
    AgentProcess,
    build_fleet,
    demo_policy,
)
from guard.demo._guard import DemoGuard
from guard.demo._live import Live, fmt_usd
from guard.demo._summary import compare, compare_runs, print_summary

__all__ = ["DemoOptions", "run_demo"]


@dataclass(slots=True)
class DemoOptions:
    quick: bool = False
    data_dir: Path | None = None  # None: a fresh temporary directory (kept, for the chart)
    out: TextIO = field(default_factory=lambda: sys.stdout)
    tty: bool | None = None
    timeout_s: float | None = None  # None: 120 s quick, 300 s full


@dataclass(slots=True)
class _Proc:
    spec: AgentProcess
    proc: asyncio.subprocess.Process
    log_path: Path
    exit_code: int | None = None


class _Demo:
    def __init__(self, opts: DemoOptions) -> None:
        self.opts = opts
        self.t0 = time.time()
        self.live = Live(opts.out, t0=self.t0, tty=opts.tty)
        self.fleet = build_fleet(quick=opts.quick)
        self.outcomes: list[dict[str, Any]] = []
        self.starts: dict[str, dict[str, Any]] = {}
        self.errors: list[dict[str, Any]] = []
        self.decisions: list[dict[str, Any]] = []
        self.procs: list[_Proc] = []
        self.live_runs: list[Any] = []
        self.budgets: list[Any] = []
        self.cancel_info: dict[str, Any] = {}
        self.admin: Any = None
        self.guard: DemoGuard | None = None

    # -------------------------------------------------------------------------- processes

    async def _spawn(self, spec: AgentProcess, endpoint: str, logs: Path, key: str) -> _Proc:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_GUARD_")}
        env["OTEL_GUARD_HMAC_KEY"] = key  # one fingerprint key for the whole deployment
        env["PYTHONUNBUFFERED"] = "1"
        log_path = logs / f"{spec.name}.log"
        with log_path.open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "guard.demo._agents",
                "--endpoint", endpoint, "--tenant", spec.tenant, "--name", spec.name,
                "--plan", json.dumps(spec.waves),
                stdout=asyncio.subprocess.PIPE, stderr=log, env=env,
            )  # fmt: skip
        return _Proc(spec, proc, log_path)

    async def _read(self, p: _Proc) -> None:
        assert p.proc.stdout is not None
        async for raw in p.proc.stdout:
            try:
                ev = json.loads(raw)
            except ValueError:
                continue
            kind = ev.get("event")
            if kind == "ready":
                runs = p.spec.runs
                self.live.line(
                    f"▶ process {p.spec.name:<11} pid {ev.get('pid')}  tenant "
                    f"{p.spec.tenant:<9} {runs} runs planned"
                )
            elif kind == "start":
                self.starts[ev["run_id"]] = ev
            elif kind == "outcome":
                self._drain_decisions()  # what the guard said before the run ended, first
                self.outcomes.append(ev)
                self.live.outcome(p.spec.name, ev["outcome"])
            elif kind == "error":
                self.errors.append(ev)
                self.live.line(self.live.style(f"! {p.spec.name}: {ev.get('error')}", "red"))
        p.exit_code = await p.proc.wait()

    # ----------------------------------------------------------------------- admin and view

    def _drain_decisions(self) -> None:
        """Show the decisions the guard recorded since the last look (acked or timed out)."""
        sink = self.guard.sink if self.guard is not None else None
        for kind, item in sink.drain() if sink is not None else []:
            if kind == "decision":
                self.decisions.append(item.to_dict())
                self.live.decision(item)

    async def _poll(self, done: asyncio.Event) -> None:
        from guard.v1 import guard_pb2 as pb

        planned = sum(s.runs for s in self.fleet)
        while not done.is_set():
            self._drain_decisions()
            if self.admin is not None:
                with contextlib.suppress(Exception):
                    resp = await self.admin.ListRuns(pb.ListRunsRequest(limit=1000), timeout=2)
                    self.live_runs = list(resp.runs)
                with contextlib.suppress(Exception):
                    resp = await self.admin.TenantBudgets(pb.TenantBudgetsRequest(), timeout=2)
                    self.budgets = list(resp.tenants)
            self.live.status(self._status_text(planned))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), timeout=0.25)

    def _status_text(self, planned: int) -> str:
        ended = [o["outcome"] for o in self.outcomes]
        steps = sum(int(o.get("steps", 0)) for o in ended)
        spend = sum(float(o.get("cost_usd") or 0.0) for o in ended)
        for r in self.live_runs:
            steps += int(r.usage.steps)
            spend += float(r.usage.cost_usd) if r.usage.HasField("cost_usd") else 0.0
        text = (
            f"runs {len(self.live_runs)} live, {len(ended)}/{planned} ended · steps {steps} · "
            f"spend {fmt_usd(spend)}"
        )
        for b in self.budgets:
            if b.tenant == BUDGET_TENANT:
                for w in b.windows:
                    if w.metric == "cost_usd":
                        text += (
                            f" · {b.tenant} ${w.used:.2f}/${w.limit:.2f} per "
                            f"{w.window_s / 3600:g}h" + (" EXHAUSTED" if b.exhausted else "")
                        )
        return text

    async def _operator_cancel(self) -> None:
        """Cancel every run of one tenant once its long conversations are well under way."""
        from guard.v1 import guard_pb2 as pb

        not_before = time.time() + (0.0 if self.opts.quick else 12.0)
        give_up = time.time() + 60.0
        while time.time() < give_up:
            await asyncio.sleep(0.2)
            mine = [s for s in self.starts.values() if s.get("kind") == "long_support"]
            guard_view = [r for r in self.live_runs if r.tenant == CANCEL_TENANT]
            ready = len(mine) >= 2 and (
                sum(1 for r in guard_view if r.usage.steps >= 3) >= 2
                or time.time() - max(s["t"] for s in mine) > 3.0  # ListRuns unavailable
            )
            if ready and time.time() >= not_before:
                break
        reason = f"operator: pause tenant {CANCEL_TENANT} for a billing review"
        self.live.line(
            self.live.style("⊘ operator", "yellow")
            + f" otel-guard cancel --tenant {CANCEL_TENANT} --reason '{reason}'"
        )
        try:
            req = pb.CancelRequest(selector=pb.Selector(tenant=CANCEL_TENANT), reason=reason)
            resp = await self.admin.Cancel(req, timeout=5)
            ids = list(resp.run_ids)
        except Exception as exc:  # report it; the staged reason will show as missing
            self.live.line(self.live.style(f"! GuardAdmin.Cancel failed: {exc!r}", "red"))
            ids = []
        self.cancel_info = {"at_s": round(time.time() - self.t0, 2), "run_ids": ids}
        self.live.line(f"  GuardAdmin.Cancel → {len(ids)} live runs of {CANCEL_TENANT} cancelled")

    # ------------------------------------------------------------------------------- main

    async def run(self) -> dict[str, Any]:
        import grpc

        from guard.v1 import guard_pb2_grpc

        opts = self.opts
        if opts.data_dir is None:
            data_dir = Path(tempfile.mkdtemp(prefix="otel-guard-demo-"))
        else:
            data_dir = opts.data_dir.resolve()
            data_dir.mkdir(parents=True, exist_ok=True)
        fresh_store = not (data_dir / "clickhouse").exists()
        logs = data_dir / "logs"
        logs.mkdir(exist_ok=True)
        demo_guard = self.guard = DemoGuard(demo_policy(), data_dir)
        endpoint = await demo_guard.start()
        live = self.live
        live.line(
            live.style("otel-guard demo", "bold")
            + f": guard on {endpoint}, embedded ClickHouse in {data_dir}/clickhouse",
            stamp=False,
        )
        planned = sum(s.runs for s in self.fleet)
        tenants = sorted({s.tenant for s in self.fleet})
        live.line(
            f"fleet: {len(self.fleet)} agent processes, {len(tenants)} tenants "
            f"({', '.join(tenants)}), {planned} runs; {BUDGET_TENANT} has a "
            f"${BUDGET_TENANT_LIMIT_USD:.2f}/hour budget; the operator will cancel "
            f"{CANCEL_TENANT} mid-demo",
            stamp=False,
        )
        channel = grpc.aio.insecure_channel(endpoint)
        self.admin = guard_pb2_grpc.GuardAdminStub(channel)
        done = asyncio.Event()
        poller = asyncio.create_task(self._poll(done))
        key = secrets.token_hex(16)
        timeout = opts.timeout_s or (120.0 if opts.quick else 300.0)
        timed_out = False
        rows: list[dict[str, Any]] = []
        stored_runs: dict[str, dict[str, str]] = {}
        chart: Path | None = None
        tasks: list[asyncio.Task[None]] = []
        try:
            self.procs = list(
                await asyncio.gather(*(self._spawn(s, endpoint, logs, key) for s in self.fleet))
            )
            canceller = asyncio.create_task(self._operator_cancel())
            readers = [asyncio.create_task(self._read(p)) for p in self.procs]
            tasks += [canceller, *readers]
            _, pending = await asyncio.wait(readers, timeout=timeout)
            if pending:
                timed_out = True
                live.line(live.style(f"! fleet still running after {timeout:.0f} s", "red"))
            # Normally the cancel happened long ago; if the tenant's runs all ended first
            # there is nothing left to cancel (the staged reason will be reported missing).
            canceller.cancel()
            # Every RunEnded the agents sent must have reached the sink before we stop.
            until = time.time() + 10.0
            assert demo_guard.sink is not None  # the demo guard's tee sink
            while demo_guard.sink.runs_written < len(self.outcomes) and time.time() < until:
                await asyncio.sleep(0.1)
            if demo_guard.sink.runs_written < len(self.outcomes):
                live.line(
                    live.style(
                        f"! the guard recorded {demo_guard.sink.runs_written} runs, the agents "
                        f"reported {len(self.outcomes)}",
                        "red",
                    )
                )
            await asyncio.sleep(0.3)  # one more poll for the last decisions
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for p in self.procs:
                if p.proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        p.proc.kill()
                    await p.proc.wait()
            done.set()
            await poller
            live.end_status()
            await channel.close()
            await demo_guard.stop()
            try:
                rows = demo_guard.read_back(since=self.t0 - 5.0)
                ids = [o["outcome"].get("run_id", "") for o in self.outcomes]
                stored_runs = demo_guard.runs_by_id(ids)
                with contextlib.suppress(Exception):
                    chart = demo_guard.chart(data_dir / "stop_reasons.png")
            finally:
                demo_guard.close()
        verdict = compare(self.outcomes, rows)
        verdict["fresh_store"] = fresh_store
        verdict["run_mismatches"] = compare_runs(self.outcomes, stored_runs)
        verdict["runs_checked"] = len(self.outcomes)
        print_summary(live, rows, verdict)
        if chart is not None:
            live.line(f"Chart: {chart}", stamp=False)
        live.line(
            f"Explore: otel-guard report --clickhouse chdb://{data_dir}/clickhouse   "
            f"(agent logs: {logs})",
            stamp=False,
        )
        elapsed = time.time() - self.t0
        ok = (
            not verdict["missing"]
            and not verdict["run_mismatches"]
            and not (verdict["mismatched"] and fresh_store)
            and not timed_out
        )
        live.line(f"Finished in {elapsed:.1f} s.", stamp=False)
        if verdict["missing"]:
            live.line(
                live.style(
                    f"FAILED: staged reasons missing: {', '.join(verdict['missing'])}", "red"
                ),
                stamp=False,
            )
        return {
            "ok": ok,
            "quick": opts.quick,
            "elapsed_s": round(elapsed, 2),
            "endpoint": endpoint,
            "data_dir": str(data_dir),
            "clickhouse": f"chdb://{data_dir}/clickhouse",
            "chart": str(chart) if chart else None,
            "timed_out": timed_out,
            "processes": [
                {
                    "name": p.spec.name,
                    "tenant": p.spec.tenant,
                    "pid": p.proc.pid,
                    "runs_planned": p.spec.runs,
                    "exit_code": p.exit_code,
                    "log": str(p.log_path),
                }
                for p in self.procs
            ],
            "runs": [
                {
                    "process": o["process"],
                    "kind": o["kind"],
                    "expect": o["expect"],
                    "outcome": o["outcome"],
                }
                for o in self.outcomes
            ],
            "distribution": rows,
            "decisions": self.decisions,
            "operator_cancel": self.cancel_info,
            "errors": self.errors,
            **verdict,
        }


def run_demo(opts: DemoOptions) -> dict[str, Any]:
    """Run the whole demo and return its summary (see ``otel-guard demo --json``)."""
    return asyncio.run(_Demo(opts).run())
