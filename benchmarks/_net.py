"""Loopback helpers shared by the benchmarks that start a guard or a receiver process."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from typing import Any

__all__ = ["free_port", "start_guard", "wait_port"]


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for processes that cannot bind port 0 and report it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout_s: float = 20.0) -> None:
    """Wait until something listens on ``port``; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited early ({proc.returncode})")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port} after {timeout_s:.0f} s")


def start_guard(
    config_path: str,
    *,
    env: dict[str, str] | None = None,
    stderr: Any = None,
    wrapper: tuple[str, ...] = (),
) -> tuple[subprocess.Popen, int]:
    """Start ``otel-guard serve`` (no store) on a free loopback port with this policy file and
    wait until it listens. Returns the process and its port; the caller terminates it.
    ``stderr``: where the guard's log goes (default: this process's stderr). ``wrapper``:
    arguments between the interpreter and ``-m guard.cli`` (e.g. a profiling script)."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            *wrapper,
            "-m",
            "guard.cli",
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--no-store",
            "--config",
            config_path,
            "--log-level",
            "WARNING",
        ],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        env=env,
    )
    wait_port(port, proc)
    return proc, port
