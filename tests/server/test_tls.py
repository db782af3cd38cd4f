"""Optional TLS on the guard's one port (self-signed certificate made with openssl)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import pytest

from guard.cli._client import AdminClient
from guard.errors import GuardUnavailable
from guard.server import GuardServer, TlsFiles

from .conftest import config

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@pytest.fixture
def cert(tmp_path):
    key, crt = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(key),
            "-out",
            str(crt),
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return str(crt), str(key)


async def test_tls_listener_serves_verified_clients_only(cert, sink):
    crt, key = cert
    tls = TlsFiles(cert=crt, key=key)
    async with GuardServer(config(), listen="127.0.0.1:0", sink=sink, tls=tls) as srv:
        with AdminClient(srv.address, tls_ca=crt) as c:
            assert (await asyncio.to_thread(c.list_runs)).total == 0
        with AdminClient(srv.address, timeout_s=2) as plain, pytest.raises(GuardUnavailable):
            await asyncio.to_thread(plain.list_runs)
