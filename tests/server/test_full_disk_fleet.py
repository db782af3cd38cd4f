"""A real guard whose data dir fills up mid-fleet: nothing acknowledged is lost, nothing is
stored twice, and every run that ended is stored once the disk has room again.

The guard (``otel-guard serve``, embedded store) keeps its data dir on a size-limited tmpfs
(mounting needs root: the test is skipped, with the reason, where it is not allowed). Real
SDK agents (``_fleet_agent.py``) end runs throughout; mid-fleet a filler file takes every
free byte of that filesystem, stays for several seconds while runs keep ending, and is then
deleted. Meanwhile the guard refuses to acknowledge what it cannot make durable, reports the
condition (health NOT_SERVING, ``Stats.store_disk_full``), and afterwards every record is in
the store exactly once (runs FINAL by run id, the view counting each run once).
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from guard.v1 import guard_pb2 as pb
from guard.v1 import guard_pb2_grpc

from . import _faults as F
from ._faults import FleetAgent, GuardProc, end_fleet, free_port, wait_until

pytestmark = pytest.mark.slow

_FS_MB = 48  # room for the engine's files, the WAL and the spool; filled by the filler
_FULL_S = 8.0  # how long the filesystem stays full while runs keep ending


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "small"
    mnt.mkdir()
    try:
        out = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={_FS_MB}m", "tmpfs", str(mnt)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as ex:
        pytest.skip(f"cannot mount a size-limited tmpfs here: {ex}")
    if out.returncode != 0:
        pytest.skip(f"cannot mount a size-limited tmpfs here: {out.stderr.strip()}")
    try:
        yield mnt
    finally:
        for _ in range(20):  # the guard's engine may still hold files for a moment
            if subprocess.run(["umount", str(mnt)], capture_output=True).returncode == 0:
                break
            time.sleep(0.5)


class _SmallDiskGuard(GuardProc):
    """``otel-guard serve`` whose data dir is ``data_dir`` (the small filesystem) while its
    config and log stay in ``home`` (a full disk must not also take the evidence)."""

    def __init__(self, port: int, home: Path, data_dir: Path) -> None:
        super().__init__(port, home, grace_s=30.0)
        self.store_dir = data_dir

    def start(self, timeout: float = 60.0) -> _SmallDiskGuard:
        cmd = [sys.executable, "-m", "guard.cli", "serve", "--listen", self.address]
        cmd += ["--data-dir", str(self.store_dir), "--config", str(self.cfg), "--json"]
        cmd += ["--log-level", "INFO", "--drain-s", "20"]
        log = open(self.data_dir / "guard.log", "a")  # noqa: SIM115 - lives with the process
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
        log.close()
        line = F._readline(self.proc, timeout)
        assert line and '"address"' in line, f"guard did not start: {line!r}"
        return self


def _fill(directory: Path) -> Path:
    """Take every free byte of ``directory``'s filesystem with one file (until ENOSPC)."""
    path = directory / "filler"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for chunk in (1 << 20, 64 << 10, 4 << 10, 512):
            data = b"\xff" * chunk
            while True:
                try:
                    if os.write(fd, data) < len(data):
                        break
                except OSError as ex:
                    if ex.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return path


class _Watch(threading.Thread):
    """Polls the guard's health and Stats while the fleet runs: what it reported."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.stop = threading.Event()
        self.not_serving = 0
        self.disk_full_seen = 0
        self.refused_max = 0.0
        self.unacked_max = 0.0

    def run(self) -> None:
        with grpc.insecure_channel(self.address) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            admin = guard_pb2_grpc.GuardAdminStub(ch)
            while not self.stop.wait(0.2):
                with contextlib.suppress(grpc.RpcError):
                    status = health.Check(health_pb2.HealthCheckRequest(), timeout=2).status
                    if status == health_pb2.HealthCheckResponse.NOT_SERVING:
                        self.not_serving += 1
                    figures = admin.Stats(pb.StatsRequest(), timeout=2).figures
                    self.disk_full_seen += int(figures.get("store_disk_full", 0.0) > 0)
                    self.refused_max = max(
                        self.refused_max, figures.get("store_records_refused", 0)
                    )
                    self.unacked_max = max(self.unacked_max, figures.get("records_unacked", 0))


def test_a_full_data_dir_mid_fleet_loses_and_doubles_nothing(tmp_path: Path, small_fs: Path):
    guard = _SmallDiskGuard(free_port(), tmp_path / "home", small_fs).start()
    bounded = 24
    agents = [
        FleetAgent(guard.address, t, bounded=bounded, idle=0, step_s=0.02)
        for t in ("acme", "globex", "initech")
    ]
    watch = _Watch(guard.address)
    try:
        watch.start()
        for a in agents:
            a.go()
        wait_until(lambda: sum(len(a.ended()) for a in agents) >= 6, 60, "runs ending")
        ended_before = sum(len(a.ended()) for a in agents)
        filler = _fill(small_fs)
        time.sleep(_FULL_S)  # runs keep ending on a full disk
        ended_while_full = sum(len(a.ended()) for a in agents) - ended_before
        filler.unlink()
        info = end_fleet(guard.address, agents, bounded)
        watch.stop.set()
        watch.join(10)
    finally:
        watch.stop.set()
        for a in agents:
            a.kill()
        guard.stop()
    log = (tmp_path / "home" / "guard.log").read_text()
    # the condition happened, was refused rather than acknowledged, and was reported
    assert ended_while_full > 0
    assert watch.refused_max > 0 or watch.unacked_max > 0, log[-3000:]
    assert watch.disk_full_seen > 0 and watch.not_serving > 0, log[-3000:]
    assert "cannot write the data dir" in log and "writable again" in log
    assert "DROPPED" not in log
    # every record acknowledged (all of them, by the agents' shutdown) is stored once
    assert info["undelivered"] == 0, info
    verdict = F.store_verdict(small_fs)
    t = F.tally(agents, verdict, idle_reason="operator_cancel")
    assert t["runs"] == 3 * bounded
    assert all(t[k] == 0 for k in ("lost", "rows_twice", "rows_unknown", "anonymous")), t
    assert t["runs_final_surplus"] == 0 and t["mv_surplus"] == 0, t
