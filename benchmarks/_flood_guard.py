"""The guard process of ``bench_flood.py`` and its readings: ``otel-guard serve`` with both
OTLP receivers and auth on, ``GuardAdmin`` calls with the tenants' and the admin's tokens,
RSS and fds (psutil), a sampling thread; and the JSON-lines child processes of the script."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import _budget_workload as W
import _flood_canary as C
import _flood_load as L
import grpc
import psutil
from _net import free_port, wait_port

from guard.v1 import guard_pb2 as pb
from guard.v1 import guard_pb2_grpc

__all__ = ["CANARIES", "LIMIT_USD", "TOKEN", "Child", "Guard", "Sampler", "shed_keys"]

TOKENS = {"FLOOD_ADMIN": "flood-admin", "FLOOD_A": "tok-a", "FLOOD_B": "tok-b", "FLOOD_C": "tok-c"}
TOKEN = {"admin": "flood-admin", "a": "tok-a", "b": "tok-b", "c": "tok-c"}
CANARIES = ("b", "c")
LIMIT_USD = 0.10
SHED_WORDS = ("refus", "shed", "reject", "drop", "overload", "capacity", "lost", "unheld")
TICK_S = 0.010  # the guard's loop-lag monitor tick (guard.server.runtime._looplag)
SCRIPT = str(Path(__file__).resolve().parent / "bench_flood.py")


def policy(max_runs: int) -> str:
    lines = [
        f"guard: {{max_tracked_runs: {max_runs}}}",
        "runs: {max_steps: 1000000000, max_tokens: 1000000000000, deadline_s: 36000}",
        "auth:",
        "  admin_token_env: FLOOD_ADMIN",
        "  tenants: {a: {token_env: FLOOD_A}, b: {token_env: FLOOD_B}, c: {token_env: FLOOD_C}}",
        "tenants:",
    ]
    for t in CANARIES:
        lines += C.policy_lines(t, LIMIT_USD)
    lines += [
        "prices:",
        '  version: "bench"',
        f"  models: {{{W.MODEL}: {{input: 6.0, output: 20.0}}}}",
    ]
    return "\n".join(lines) + "\n"


class Child:
    """A child process of this script speaking JSON lines (stdin commands, stdout answers)."""

    def __init__(self, *args: str) -> None:
        self.transport = args[args.index("--transport") + 1] if "--transport" in args else ""
        cmd = [sys.executable, SCRIPT, *args]
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def send(self, line: str) -> None:
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def recv(self) -> dict:
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"child {self.p.args[2:5]} exited ({self.p.poll()})")
        return json.loads(line)

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)


class Guard:
    def __init__(self, tmp: str, max_runs: int) -> None:
        cfg = Path(tmp) / "guard.yaml"
        cfg.write_text(policy(max_runs))
        self.port, self.http_port = free_port(), free_port()
        self.log = open(Path(tmp) / "guard.log", "w+b")  # noqa: SIM115 (closed in stop)
        # OTEL_GUARD_FLOOD_PROFILE=PREFIX: the guard runs under _profiled_guard (the flood
        # phase is profiled to PREFIX.0; a profiled run's figures are not to be quoted)
        prof = os.environ.get("OTEL_GUARD_FLOOD_PROFILE")
        wrap = [str(Path(__file__).with_name("_profiled_guard.py")), prof] if prof else []
        cmd = [sys.executable, *wrap, "-m", "guard.cli", "serve"]
        cmd += ["--listen", f"127.0.0.1:{self.port}"]
        cmd += ["--http-listen", f"127.0.0.1:{self.http_port}", "--no-store"]
        cmd += ["--config", str(cfg), "--log-level", "WARNING"]
        self.p = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=self.log, env={**os.environ, **TOKENS}
        )
        wait_port(self.port, self.p)
        wait_port(self.http_port, self.p)
        self.address = f"127.0.0.1:{self.port}"
        self.http_url = f"http://127.0.0.1:{self.http_port}/v1/traces"
        self.ps = psutil.Process(self.p.pid)
        self.channel = grpc.insecure_channel(self.address)
        self.admin = guard_pb2_grpc.GuardAdminStub(self.channel)

    def stats(self) -> dict[str, float]:
        r = self.admin.Stats(pb.StatsRequest(), metadata=L.md(TOKEN["admin"]), timeout=30)
        return dict(r.figures)

    def profile(self, on: bool) -> None:
        """Start (or stop and write) the guard's profile when it runs under _profiled_guard."""
        if os.environ.get("OTEL_GUARD_FLOOD_PROFILE"):
            self.p.send_signal(signal.SIGUSR1 if on else signal.SIGUSR2)

    def resources(self) -> dict[str, float]:
        rss = self.ps.memory_info().rss
        rss += sum(c.memory_info().rss for c in self.ps.children(recursive=True))
        return {"rss_mb": round(rss / 2**20, 1), "fds": self.ps.num_fds()}

    def runs_of(self, tenant: str, prefix: str) -> dict[str, list[int]]:
        req = pb.ListRunsRequest(limit=100_000)
        r = self.admin.ListRuns(req, metadata=L.md(TOKEN[tenant]), timeout=60)
        return {
            s.run_id: [s.usage.model_calls, s.usage.input_tokens]
            for s in r.runs
            if s.run_id.startswith(prefix)
        }

    def budget(self, tenant: str) -> dict[str, Any]:
        req = pb.TenantBudgetsRequest(tenant=tenant)
        r = self.admin.TenantBudgets(req, metadata=L.md(TOKEN[tenant]), timeout=30)
        t = r.tenants[0]
        w = [x for x in t.windows if x.metric == "cost_usd"]
        return {
            "spent_usd": round(w[0].used, 6) if w else None,
            "limit_usd": w[0].limit if w else None,
            "exhausted": t.exhausted,
        }

    def stop(self) -> None:
        self.channel.close()
        self.p.terminate()
        try:
            self.p.wait(20)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(10)
        self.log.close()

    def tail(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-3000:]


class Sampler:
    """Stats and resources of the guard every ``every_s`` while running (a thread)."""

    def __init__(self, g: Guard, every_s: float = 0.5) -> None:
        self.g, self.every_s = g, every_s
        self.stop = threading.Event()
        self.stats: list[dict] = []
        self.res: list[dict] = []
        self.stats_call_ms: list[float] = []
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.res.append(self.g.resources())
            t0 = time.perf_counter()
            try:
                figures = self.g.stats()
                self.stats_call_ms.append((time.perf_counter() - t0) * 1e3)
                figures["_t"] = time.monotonic()
                self.stats.append(figures)
            except grpc.RpcError:
                pass
            self.stop.wait(self.every_s)

    def finish(self) -> Sampler:
        self.stop.set()
        self.t.join(60)
        return self

    def lag(self) -> dict[str, float | None]:
        def top(k: str) -> float | None:
            xs = [s[k] for s in self.stats if k in s]
            return round(max(xs), 2) if xs else None

        mean = None
        if len(self.stats) >= 2:  # the monitor ticks every 10 ms plus the lag: its tick rate
            a, b = self.stats[0], self.stats[-1]
            ticks = b.get("loop_lag_samples", 0) - a.get("loop_lag_samples", 0)
            if ticks > 0:
                mean = round(max(0.0, ((b["_t"] - a["_t"]) / ticks - TICK_S) * 1e3), 2)
        return {
            "mean_ms_this_phase": mean,
            "recent_max_ms": top("loop_lag_recent_max_ms"),
            "p99_ms": top("loop_lag_p99_ms"),
            "busy_p99_ms": top("loop_busy_p99_ms"),
            "stats_call_ms": C.pct(self.stats_call_ms),
        }


def shed_keys(s: dict[str, float]) -> dict[str, float]:
    """Every figure whose name says refused / shed / rejected / dropped (whatever exists)."""
    return {k: v for k, v in sorted(s.items()) if any(w in k for w in SHED_WORDS)}
