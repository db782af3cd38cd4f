"""Start the rotel collector (PyPI ``rotel``, a Rust OTLP collector) on loopback.

The settings come from ``collector/rotel.env``, the file operators use; only the receiver and
exporter endpoints are replaced. Used by the collector tests and by end-to-end tests that put a
real collector between the agents and the guard.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from _wait import wait_until

__all__ = [
    "ROTEL_ENV_FILE",
    "RotelProcess",
    "free_port",
    "read_env_file",
    "rotel_binary",
    "run_rotel",
]

REPO = Path(__file__).resolve().parents[2]
ROTEL_ENV_FILE = REPO / "collector" / "rotel.env"


def rotel_binary() -> Path:
    """The ``rotel-agent`` executable shipped inside the ``rotel`` wheel."""
    import rotel

    return Path(rotel.__file__).resolve().parent / "rotel-agent"


def read_env_file(path: Path = ROTEL_ENV_FILE) -> dict[str, str]:
    """Parse a KEY=VALUE file (``#`` comments, blank lines ignored)."""
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{path}: not KEY=VALUE: {line!r}")
        env[key.strip()] = value.strip()
    return env


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (rotel cannot bind port 0 and report it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen, timeout_s: float) -> None:
    def listening() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"rotel exited with code {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    wait_until(listening, timeout_s, f"rotel to listen on 127.0.0.1:{port}", interval_s=0.02)


@dataclass
class RotelProcess:
    endpoint: str  # host:port of rotel's OTLP/gRPC receiver
    argv: list[str]
    env: dict[str, str]  # the ROTEL_* settings it ran with
    proc: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextmanager
def run_rotel(
    exporter_endpoint: str,
    workdir: Path,
    *,
    overrides: dict[str, str] | None = None,
    start_timeout_s: float = 20.0,
) -> Iterator[RotelProcess]:
    """Run rotel in the foreground: OTLP/gRPC in on a free loopback port, OTLP/gRPC out to
    ``exporter_endpoint`` (``host:port``), everything else from ``collector/rotel.env``.
    """
    grpc_port, http_port = free_port(), free_port()
    settings = read_env_file()
    settings.update(
        ROTEL_OTLP_GRPC_ENDPOINT=f"127.0.0.1:{grpc_port}",
        ROTEL_OTLP_HTTP_ENDPOINT=f"127.0.0.1:{http_port}",
        ROTEL_OTLP_EXPORTER_ENDPOINT=f"http://{exporter_endpoint}",
        ROTEL_PID_FILE=str(workdir / "rotel.pid"),
        ROTEL_LOG_FILE=str(workdir / "rotel-daemon.log"),
    )
    settings.update(overrides or {})
    # Only PATH etc. from the parent, so a stray ROTEL_* variable cannot change the test.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROTEL_")}
    env.update(settings)
    argv = [str(rotel_binary()), "start"]
    log_path = workdir / "rotel.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_listening(grpc_port, proc, start_timeout_s)
        yield RotelProcess(f"127.0.0.1:{grpc_port}", argv, settings, proc, log_path)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
