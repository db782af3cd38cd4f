"""`otel-guard health` against a real guard: the container image's HEALTHCHECK command."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys

import pytest
from grpc_health.v1 import health_pb2

from guard.cli import main
from guard.server import GuardServer, ServerThread, TlsFiles

from .conftest import config


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serving_guard_exits_0_through_the_console_entry_point() -> None:
    with ServerThread() as srv:
        proc = subprocess.run(
            [sys.executable, "-m", "guard.cli", "health", "--endpoint", srv.address],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == f"otel-guard health: {srv.address} is SERVING"


def test_unreachable_guard_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    address = f"127.0.0.1:{_closed_port()}"
    assert main(["health", "--endpoint", address, "--timeout-s", "2"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"otel-guard health: {address} is UNREACHABLE (UNAVAILABLE"), err
    assert "\n" not in err


def test_endpoint_defaults_to_the_environment(monkeypatch, capsys) -> None:
    with ServerThread() as srv:
        monkeypatch.setenv("OTEL_GUARD_ENDPOINT", f"grpc://{srv.address}")
        assert main(["health"]) == 0
    assert capsys.readouterr().out.strip() == f"otel-guard health: {srv.address} is SERVING"


def test_one_service_and_an_unknown_one(capsys: pytest.CaptureFixture[str]) -> None:
    with ServerThread() as srv:
        assert (
            main(["health", "--endpoint", srv.address, "--service", "guard.v1.GuardControl"]) == 0
        )
        assert "is SERVING" in capsys.readouterr().out
        assert main(["health", "--endpoint", srv.address, "--service", "no.such.Service"]) == 1
    err = capsys.readouterr().err.strip()
    assert (
        err == f"otel-guard health: service 'no.such.Service' at {srv.address} is SERVICE_UNKNOWN"
    )


async def test_not_serving_exits_1(sink, capsys: pytest.CaptureFixture[str]) -> None:
    """NOT_SERVING (what a draining guard, or one whose records cannot be made durable,
    answers) is a failed check."""
    async with GuardServer(config(), listen="127.0.0.1:0", sink=sink) as srv:
        await srv._health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        code = await asyncio.to_thread(main, ["health", "--endpoint", srv.address])
        assert code == 1
        assert capsys.readouterr().err.strip() == f"otel-guard health: {srv.address} is NOT_SERVING"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
async def test_tls_guard_needs_its_ca(sink, tmp_path) -> None:
    key, crt = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(crt), "-subj", "/CN=localhost"),
            *("-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    tls = TlsFiles(cert=str(crt), key=str(key))
    async with GuardServer(config(), listen="127.0.0.1:0", sink=sink, tls=tls) as srv:
        args = ["health", "--endpoint", srv.address, "--timeout-s", "2"]
        assert await asyncio.to_thread(main, [*args, "--tls-ca", str(crt)]) == 0
        assert await asyncio.to_thread(main, args) == 1  # plaintext against a TLS port
