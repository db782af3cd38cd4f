"""A fleet of guard replicas in their own processes, sharing one real ``redis-server``.

    with Fleet(tmp_path, replicas=3) as fleet:
        agent = fleet.agent("acme", bounded=4, idle=1)          # endpoint "r0,r1,r2"
        spans = fleet.agent("acme", bounded=2, idle=0,          # spans to r0 only,
                            endpoint=fleet.endpoint(1, 2), span_endpoint=fleet.endpoint(0))
        agent.go(); ...
        fleet.kill(1); fleet.start(1)                            # SIGKILL, restart: WAL replay
        fleet.redis.stop(); fleet.redis.start()                  # Redis away, back empty
        verdict = fleet.verdict()                                # stops every replica, reads
                                                                 # the union of their stores

Each replica is ``python -m guard.cli serve --redis URL --data-dir <own dir> --guard-id r<i>
--json`` on ``127.0.0.1:0`` (the bound address is read from its JSON line; a restart binds
the same port). Production replicas share one ClickHouse server; none exists on this machine
and the embedded engine locks its directory, so each replica has its own embedded store and
"one record per run" is checked over the union of the stores. Agents are the fault suite's
real-SDK agent processes (``tests/server/_fleet_agent.py``); the Redis server is the one of
the Redis tests (``tests/redisstate/_server.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from redisstate._server import RedisServer
from server import _faults as F

__all__ = ["Fleet", "Replica", "span_env"]


class Replica(F.GuardProc):
    """One ``otel-guard serve --redis`` replica with its own data dir (restartable)."""

    def __init__(self, root: Path, name: str, redis_url: str, *, grace_s: float = 30.0) -> None:
        super().__init__(0, root / name, grace_s=grace_s)
        self.name, self.redis_url = name, redis_url
        self.extra_args: list[str] = []

    def start(self, timeout: float = 60.0) -> Replica:
        return self.spawn().ready(timeout)

    def spawn(self) -> Replica:
        """Start the process (on the port it had, if it ran before); :meth:`ready` waits."""
        cmd = [sys.executable, "-m", "guard.cli", "serve", "--listen", self.address]
        cmd += ["--data-dir", str(self.data_dir), "--config", str(self.cfg), "--json"]
        cmd += ["--redis", self.redis_url, "--guard-id", self.name]
        cmd += ["--log-level", "INFO", "--drain-s", "5", *self.extra_args]
        log = open(self.data_dir / "guard.log", "a")  # noqa: SIM115 - lives with the process
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
        log.close()
        return self

    def ready(self, timeout: float = 60.0) -> Replica:
        """Wait for the JSON line with the bound address."""
        assert self.proc is not None
        line = F._readline(self.proc, timeout)
        assert line, f"{self.name} did not start: {self.log()[-2000:]}"
        self.port = int(json.loads(line)["address"].rsplit(":", 1)[1])
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        return (self.data_dir / "guard.log").read_text(errors="replace")


@contextlib.contextmanager
def span_env(span_endpoint: str | None) -> Iterator[None]:
    """``OTEL_GUARD_SPAN_ENDPOINT`` for the agent process started inside (it copies the
    environment when it starts)."""
    key = "OTEL_GUARD_SPAN_ENDPOINT"
    old = os.environ.get(key)
    if span_endpoint is not None:
        os.environ[key] = span_endpoint
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


class Fleet:
    """Redis, ``replicas`` guard replicas and the agent processes started through it."""

    def __init__(self, root: Path, replicas: int = 3, *, grace_s: float = 30.0) -> None:
        self.root = root
        (root / "redis").mkdir(parents=True, exist_ok=True)
        self.redis = RedisServer(root / "redis")
        self.redis.start()
        self.replicas = [
            Replica(root, f"r{i}", self.redis.url, grace_s=grace_s) for i in range(replicas)
        ]
        self.agents: list[F.FleetAgent] = []
        try:
            for r in self.replicas:  # in parallel: each opens its embedded store (seconds)
                r.spawn()
            for r in self.replicas:
                r.ready()
        except BaseException:
            self.close()
            raise

    def endpoint(self, *which: int) -> str:
        """The endpoint list of these replicas (all when none is named)."""
        idx = which or range(len(self.replicas))
        return ",".join(self.replicas[i].address for i in idx)

    def agent(
        self,
        tenant: str,
        *,
        bounded: int,
        idle: int = 0,
        endpoint: str | None = None,
        span_endpoint: str | None = None,
        step_s: float = 0.03,
    ) -> F.FleetAgent:
        """A real-SDK agent process (``_fleet_agent.py``; bounded runs stop at max_steps 30)."""
        with span_env(span_endpoint):
            a = F.FleetAgent(endpoint or self.endpoint(), tenant, bounded, idle, step_s)
        self.agents.append(a)
        return a

    def kill(self, i: int) -> None:
        self.replicas[i].kill()

    def start(self, i: int) -> None:
        self.replicas[i].start()

    def listed(self, i: int) -> dict[str, Any]:
        """run_id -> RunStatus of the runs replica ``i`` holds ({} while it is down): its own
        listing, so a dead replica's fleet-query timeout is not in the measurement."""
        if not self.replicas[i].running:
            return {}
        try:
            return F.listed(self.replicas[i].address, local=True)
        except Exception:  # being killed or restarted
            return {}

    def figures(self, i: int) -> dict[str, float]:
        """Replica ``i``'s ``GuardAdmin.Stats`` figures (the registry's counters and sizes)."""
        from guard.cli._client import AdminClient
        from guard.v1 import guard_pb2 as pb

        with AdminClient(self.replicas[i].address) as c:
            return dict(c._call("Stats", pb.StatsRequest()).figures)

    def holders(self) -> dict[str, int]:
        """run_id -> the replica holding its connected control stream."""
        return {
            rid: i
            for i in range(len(self.replicas))
            for rid, r in self.listed(i).items()
            if r.connected
        }

    def kill_holder(self, agent: F.FleetAgent) -> tuple[int, set[str]]:
        """SIGKILL the replica holding ``agent``'s live runs (at least one must be live).
        Returns its index and every run it held, of any agent."""

        def held() -> tuple[dict[str, int], set[str]] | None:
            # the agent's live runs are read again each time: a bounded run that ends before
            # a replica lists it as held must not keep the wait from ever succeeding
            where, live = self.holders(), agent.live()
            return (where, live) if where and live and live <= set(where) else None

        where, live = F.wait_until(held, 30, "held")
        victim = where[next(iter(live))]
        self.kill(victim)
        return victim, {rid for rid, i in where.items() if i == victim}

    def guarded_again(self, victim: int, runs: set[str]) -> bool:
        """Is every one of ``runs`` still live in its agent connected on a replica other than
        ``victim`` (as that replica's ListRuns shows it)?"""
        still = runs & set().union(*(a.live() for a in self.agents))
        seen = {
            rid
            for i in range(len(self.replicas))
            if i != victim
            for rid, r in self.listed(i).items()
            if r.connected
        }
        return still <= seen

    def end(self, bounded: int) -> dict[str, Any]:
        """Let every agent's bounded runs finish, cancel the idle ones (through every replica),
        wait for the agents to exit (each waits for its records' acks), stop the replicas and
        tally the union of their stores (``F.tally``, plus ``unacknowledged``: records the
        SDKs could not deliver, and ``by_replica``: rows per replica)."""
        for a in self.agents:
            F.wait_until(lambda a=a: len(a.ended()) >= bounded, 120, f"{a.tenant} bounded runs")
        for t in sorted({a.tenant for a in self.agents}):
            self.cancel_tenant(t)
        unacked = sum(
            a.finish(60)["stats"].get("control_records_unacknowledged", 0) for a in self.agents
        )
        verdict = self.verdict()
        out = F.tally(self.agents, verdict, idle_reason="operator_cancel")
        out["unacknowledged"] = unacked
        out["by_replica"] = verdict["by_replica"]
        return out

    def cancel_tenant(self, tenant: str) -> list[str]:
        """``otel-guard cancel --tenant`` through every live replica (one replica reaches the
        whole fleet only once the directive bus routes cancels)."""
        return [
            rid for r in self.replicas if r.running for rid in F.cancel_tenant(r.address, tenant)
        ]

    def stop(self) -> None:
        """SIGTERM every replica (each drains and flushes its store)."""
        for r in self.replicas:
            r.stop()

    def verdict(self) -> dict[str, Any]:
        """Stop the replicas and read every store back: the union, with rows per run id
        summed over the stores (``F.tally`` reads it like one guard's verdict)."""
        self.stop()
        union: dict[str, Any] = {"per_run": {}, "rows": {}, "runs_final": 0, "mv_runs": 0}
        union["by_replica"] = {}
        for r in self.replicas:
            assert r.proc is not None and r.proc.returncode == 0, f"{r.name} did not drain"
            v = F.store_verdict(r.data_dir)  # a drained store: nothing left to replay
            for rid, n in v["per_run"].items():
                union["per_run"][rid] = union["per_run"].get(rid, 0) + n
            union["rows"].update(v["rows"])
            union["runs_final"] += v["runs_final"]
            union["mv_runs"] += v["mv_runs"]
            union["by_replica"][r.name] = len(v["per_run"])
        return union

    def close(self) -> None:
        for a in self.agents:
            a.kill()
        for r in self.replicas:
            with contextlib.suppress(Exception):
                r.stop()
        self.redis.stop()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
