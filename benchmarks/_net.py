"""Loopback helpers shared by the benchmarks that start a guard or a receiver process."""

from __future__ import annotations

import socket
import subprocess
import time

__all__ = ["free_port", "wait_port"]


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
