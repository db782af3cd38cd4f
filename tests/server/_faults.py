"""Real-process fault harness: the guard as ``python -m guard.cli serve`` with the embedded
store in a data dir, fleet agents (``_fleet_agent.py``), SIGKILL, restart, and the store's
verdict read back afterwards. Used by ``test_faults.py`` and ``benchmarks/soak_guard_kill.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _wait import wait_until  # re-exported: the benchmarks' soaks wait with it too

from guard.cli._client import AdminClient

__all__ = [
    "MAX_STEPS",
    "FleetAgent",
    "GuardProc",
    "cancel_tenant",
    "end_fleet",
    "free_port",
    "listed",
    "running",
    "store_verdict",
    "tally",
    "wait_until",
]

_AGENT = str(Path(__file__).with_name("_fleet_agent.py"))
MAX_STEPS = 30  # _fleet_agent's bounded runs: they only ever stop by max_steps


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GuardProc:
    """``otel-guard serve`` on a fixed loopback port and data dir (so it can be restarted)."""

    def __init__(
        self,
        port: int,
        data_dir: Path,
        *,
        grace_s: float = 30.0,
        dsn: str | None = None,
        drain_s: float = 5.0,
    ) -> None:
        self.port, self.data_dir, self.dsn, self.drain_s = port, data_dir, dsn, drain_s
        self.cfg = data_dir / "guard.yaml"
        data_dir.mkdir(parents=True, exist_ok=True)
        self.cfg.write_text(f"guard:\n  agent_grace_s: {grace_s}\n")
        self.proc: subprocess.Popen[str] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> GuardProc:
        cmd = [sys.executable, "-m", "guard.cli", "serve", "--listen", self.address]
        cmd += ["--data-dir", str(self.data_dir), "--config", str(self.cfg), "--json"]
        cmd += ["--log-level", "WARNING", "--drain-s", f"{self.drain_s:g}"]
        if self.dsn:
            cmd += ["--clickhouse", self.dsn]
        log = open(self.data_dir / "guard.log", "a")  # noqa: SIM115 - lives with the process
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
        log.close()
        line = _readline(self.proc, timeout)
        assert line and json.loads(line)["address"], f"guard did not start: {line!r}"
        self.started_at = time.monotonic()
        return self

    def kill(self) -> None:
        """SIGKILL: no drain, no flush."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.proc.stdout.close()  # type: ignore[union-attr]

    def stop(self) -> None:
        """SIGTERM: the drain flushes the store."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc.stdout.close()  # type: ignore[union-attr]


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    box: list[str] = []
    t = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    t.start()
    t.join(timeout)
    return box[0] if box else ""


class FleetAgent:
    """One ``_fleet_agent.py`` process; its JSON events are collected on a reader thread."""

    def __init__(self, endpoint: str, tenant: str, bounded: int, idle: int, step_s: float = 0.03):
        env = dict(os.environ)
        for k in ("OTEL_GUARD_TOKEN", "OTEL_GUARD_ENDPOINT", "OTEL_GUARD_TENANT"):
            env.pop(k, None)
        self.tenant = tenant
        self.proc = subprocess.Popen(
            [sys.executable, _AGENT, endpoint, tenant, str(bounded), str(idle), str(step_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            if line.strip():
                with self._cond:
                    self.events.append(json.loads(line))
                    self._cond.notify_all()

    def of(self, event: str) -> list[dict[str, Any]]:
        with self._cond:
            return [e for e in self.events if e["event"] == event]

    def wait(self, event: str, n: int = 1, timeout: float = 60.0) -> list[dict[str, Any]]:
        with self._cond:
            ok = self._cond.wait_for(lambda: len(self.of(event)) >= n, timeout)
        assert ok, f"{self.tenant}: fewer than {n} {event!r} events: {self.events[-3:]}"
        return self.of(event)

    def go(self) -> None:
        self.wait("ready")
        self.proc.stdin.write("go\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]

    def started(self) -> dict[str, str]:
        """run_id -> kind ("bounded" / "idle") of every run this agent started."""
        return {e["run_id"]: e["kind"] for e in self.of("started")}

    def ended(self) -> dict[str, dict[str, Any]]:
        return {e["run_id"]: e for e in self.of("ended")}

    def live(self) -> set[str]:
        return set(self.started()) - set(self.ended())

    def finish(self, timeout: float = 60.0) -> dict[str, Any]:
        """Wait for a clean exit; returns the ``done`` event (the SDK's counters)."""
        rc = self.proc.wait(timeout)
        self._reader.join(5)
        assert rc == 0, f"{self.tenant}: agent exited {rc}"
        (done,) = self.of("done")
        return done

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def listed(address: str, *, local: bool = False) -> dict[str, Any]:
    """run_id -> RunStatus of every run the guard lists (admin view); ``local``: only the runs
    whose streams this replica holds (no fleet query)."""
    with AdminClient(address) as c:
        return {r.run_id: r for r in c.list_runs(local=local).runs}


def cancel_tenant(address: str, tenant: str) -> list[str]:
    """``otel-guard cancel --tenant`` through the real CLI; returns the cancelled run ids."""
    cmd = [sys.executable, "-m", "guard.cli", "cancel", "--tenant", tenant, "--json"]
    out = subprocess.run(
        [*cmd, "--endpoint", address, "--reason", "fault suite"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return list(json.loads(out.stdout)["cancelled"])


@contextlib.contextmanager
def running(guard: GuardProc, agents: list[FleetAgent]) -> Iterator[None]:
    """Whatever happens inside: the agents are killed and the guard stopped (drained)."""
    try:
        yield
    finally:
        for a in agents:
            a.kill()
        guard.stop()


def end_fleet(address: str, agents: list[FleetAgent], bounded: int) -> dict[str, Any]:
    """Let every agent's bounded runs finish, cancel each tenant's idle runs with the CLI,
    and wait for every agent to exit cleanly. Returns the cancelled run ids by tenant and
    how many records the SDKs reported they could not deliver at shutdown."""
    for a in agents:
        wait_until(lambda a=a: len(a.ended()) >= bounded, 120, f"{a.tenant} bounded runs")
    cancelled = {t: cancel_tenant(address, t) for t in sorted({a.tenant for a in agents})}
    undelivered = sum(
        a.finish(60)["stats"].get("control_records_unacknowledged", 0) for a in agents
    )
    return {"cancelled": cancelled, "undelivered": undelivered}


def store_verdict(data_dir: Path) -> dict[str, Any]:
    """Open the guard's embedded store after the guard stopped (replaying what it left in
    its WAL and spool) and read back: rows per run id in ``runs`` (FINAL), the run count of
    ``stop_reasons_1m`` per run id's (status, reason), and each run's row."""
    from guard.store import open_store

    with open_store(None, data_dir=data_dir, flush_interval_s=0.05) as s:
        assert s.flush(60), s.counters()
        q = s.query
        rows = q(
            "SELECT run_id, count(), any(tenant), any(agent), any(reason), any(steps), "
            "any(decided_by) FROM otel_guard.runs FINAL GROUP BY run_id"
        )
        raw = q("SELECT count() FROM otel_guard.runs FINAL")[0][0]
        mv = q("SELECT sum(runs) FROM otel_guard.stop_reasons_1m")[0][0]
    return {
        "per_run": {r[0]: r[1] for r in rows},
        "rows": {
            r[0]: {"tenant": r[2], "agent": r[3], "reason": r[4], "steps": r[5], "by": r[6]}
            for r in rows
        },
        "runs_final": int(raw),
        "mv_runs": int(mv or 0),
    }


def tally(agents: list[FleetAgent], verdict: dict[str, Any], *, idle_reason: str) -> dict:
    """What went wrong, counted (all zero when the contract holds): records lost, runs with
    more than one row (FINAL), rows nobody started, the distribution's surplus over the runs,
    rows without tenant or agent, bounded runs stopped before their limit (agent or store
    side), idle runs ended for another reason; with a few run ids of each for the message."""
    started: dict[str, str] = {}
    for a in agents:
        started.update(a.started())
    per_run, rows = verdict["per_run"], verdict["rows"]
    early = {
        e["run_id"]
        for a in agents
        for e in a.ended().values()
        if started.get(e["run_id"]) == "bounded"
        and (e["reason"], e["steps"]) != ("max_steps", MAX_STEPS)
    }
    early |= {
        r
        for r, k in started.items()
        if k == "bounded"
        and r in rows
        and (rows[r]["reason"], rows[r]["steps"]) != ("max_steps", MAX_STEPS)
    }
    bad = {
        "lost": sorted(set(started) - set(per_run)),
        "rows_twice": sorted(r for r, n in per_run.items() if n != 1),
        "rows_unknown": sorted(set(per_run) - set(started)),
        "anonymous": sorted(r for r, row in rows.items() if not (row["tenant"] and row["agent"])),
        "early_stops": sorted(early),
        "idle_wrong_reason": sorted(
            r
            for r, k in started.items()
            if k == "idle" and r in rows and rows[r]["reason"] != idle_reason
        ),
    }
    out: dict[str, Any] = {k: len(v) for k, v in bad.items()}
    out["runs"] = len(started)
    out["runs_final_surplus"] = verdict["runs_final"] - len(started)
    out["mv_surplus"] = verdict["mv_runs"] - len(started)
    out["examples"] = {k: v[:3] for k, v in bad.items() if v}
    return out
