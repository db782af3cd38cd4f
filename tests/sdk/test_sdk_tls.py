"""The SDK against a guard with TLS from a private CA, and with client certificates (mTLS).

The certificates are made with the openssl command line in a temporary directory: a CA, a
server certificate for 127.0.0.1 and a client certificate, all signed by that CA.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _sdk_real_guard import guard_in_thread
from _wait import wait_until

import guard
from guard.errors import ConfigError
from guard.sdk._api import reset
from guard.sdk._config import Settings, _validate
from guard.sdk._runtime import get_runtime
from guard.testing import capture_spans

server_mod = pytest.importorskip("guard.server")
pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _leaf(d: Path, name: str, ext: str) -> None:
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)  # fmt: skip
    (d / f"{name}.ext").write_text(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "1", "-out", f"{name}.pem",
             "-extfile", f"{name}.ext", cwd=d)  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-days", "1", "-keyout", "ca.key", "-out", "ca.pem",
             "-subj", "/CN=otel-guard test CA", cwd=d)  # fmt: skip
    _leaf(d, "guard", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    _leaf(d, "agent", "extendedKeyUsage=clientAuth\n")
    _leaf(d, "named", "subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n")  # no IP
    names = ("ca.pem", "guard.pem", "guard.key", "agent.pem", "agent.key", "named.pem", "named.key")
    return {n: str(d / n) for n in names}


@pytest.fixture
def mtls_guard(pki: dict[str, str]) -> Iterator[dict[str, Any]]:
    """A real guard on 127.0.0.1:0 that requires client certificates signed by the test CA."""
    tls = server_mod.TlsFiles(cert=pki["guard.pem"], key=pki["guard.key"], client_ca=pki["ca.pem"])
    with guard_in_thread({"runs": {"max_steps": 3}}, tls=tls) as box:
        yield box


@guard.run(agent="tls-bot", max_steps=10)  # the guard's policy tightens this to 3
def _loop() -> None:
    while True:
        with guard.step() as step:
            step.model_call(model="gpt-4.1", input_tokens=10, output_tokens=1)
            step.tool_call("search", {"q": f"page {step.index}"}, result=step.index)


def test_mtls_guard_admits_the_agent_with_its_client_certificate(
    pki: dict[str, str], mtls_guard: dict[str, Any]
) -> None:
    with capture_spans(
        endpoint=f"127.0.0.1:{mtls_guard['port']}",
        tls_ca_file=pki["ca.pem"],
        tls_cert_file=pki["agent.pem"],
        tls_key_file=pki["agent.key"],
    ):
        control = get_runtime().control
        assert control is not None and control.connected.wait(10), dict(control.counters)
        with pytest.raises(guard.RunStopped) as info:
            _loop()
        assert (info.value.outcome.reason, info.value.outcome.steps) == ("max_steps", 3)
        proc = get_runtime().processor
        assert proc is not None
        wait_until(lambda: proc.exported >= 10, 10, lambda: f"10 spans exported ({proc.exported})")
        assert proc.failed == 0
        guard.shutdown()
    wait_until(lambda: len(mtls_guard["sink"].runs) == 1, 10)
    rec = mtls_guard["sink"].runs[0]
    assert (rec.reason.value, rec.steps) == ("max_steps", 3)


def test_without_a_client_certificate_the_agent_runs_under_local_limits(
    pki: dict[str, str], mtls_guard: dict[str, Any]
) -> None:
    """The CA alone verifies the guard, but the guard refuses the handshake: fail-open."""
    with capture_spans(
        endpoint=f"127.0.0.1:{mtls_guard['port']}",
        tls_ca_file=pki["ca.pem"],
        export_timeout_s=0.2,  # every export is refused too
        shutdown_ack_timeout_s=0.1,  # the RunEnded records have nowhere to go: do not wait
    ):
        control = get_runtime().control
        assert control is not None
        wait_until(lambda: control.counters["errors"] >= 1, 10)
        assert not control.connected.is_set()

        @guard.run(agent="tls-bot", max_steps=2)
        def short() -> str:
            with guard.step():
                pass
            return "done"

        assert short() == "done"  # not blocked by the unreachable guard
        guard.shutdown()
    assert mtls_guard["sink"].runs == []


def test_tls_files_are_checked_at_configure(pki: dict[str, str], tmp_path: Path) -> None:
    s = _validate(Settings(endpoint="g:4317", tls_ca_file=pki["ca.pem"]))
    assert s.secure and s.span_secure and s.tls_files
    assert not _validate(Settings(endpoint="g:4317")).secure
    with pytest.raises(ConfigError, match=r"tls_ca_file.*cannot read"):
        _validate(Settings(tls_ca_file=str(tmp_path / "missing.pem")))
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    with pytest.raises(ConfigError, match="not a PEM file"):
        _validate(Settings(tls_ca_file=str(junk)))
    with pytest.raises(ConfigError, match=r"tls_key_file.*go together"):
        _validate(Settings(tls_cert_file=pki["agent.pem"]))
    with pytest.raises(ConfigError, match="expected a file path"):
        _validate(Settings(tls_ca_file=5))  # type: ignore[arg-type]


def test_tls_settings_from_the_environment(
    pki: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_GUARD_TLS_CA_FILE", pki["ca.pem"])
    monkeypatch.setenv("OTEL_GUARD_TLS_CERT_FILE", pki["agent.pem"])
    monkeypatch.setenv("OTEL_GUARD_TLS_KEY_FILE", pki["agent.key"])
    monkeypatch.setenv("OTEL_GUARD_TLS", "0")
    try:
        s = guard.configure()
        assert (s.tls_ca_file, s.tls_cert_file, s.tls_key_file) == (
            pki["ca.pem"],
            pki["agent.pem"],
            pki["agent.key"],
        )
        assert s.tls is False and s.tls_files  # the files alone select TLS
    finally:
        reset()
    monkeypatch.setenv("OTEL_GUARD_TLS_KEY_FILE", "")  # empty = unset: the cert is alone
    with pytest.raises(ConfigError, match="go together"):
        guard.configure()
    reset()
    assert os.environ["OTEL_GUARD_TLS_CA_FILE"] == pki["ca.pem"]


def test_a_name_the_sdk_resolves_is_still_the_name_tls_verifies(pki: dict[str, str]) -> None:
    """``endpoint`` lists a dead guard and ``localhost:PORT``; the SDK resolves the name and
    dials the address, and TLS still checks the certificate (DNS:localhost only, no IP
    entry) against the configured name, for the control stream and the span export."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    tls = server_mod.TlsFiles(cert=pki["named.pem"], key=pki["named.key"])
    with guard_in_thread({"runs": {"max_steps": 3}}, tls=tls) as box:
        with capture_spans(
            endpoint=f"https://127.0.0.1:{dead},https://localhost:{box['port']}",
            tls_ca_file=pki["ca.pem"],
            admit_timeout_ms=3000,
        ):
            with pytest.raises(guard.RunStopped) as info:
                _loop()
            assert (info.value.outcome.reason, info.value.outcome.steps) == ("max_steps", 3)
            proc = get_runtime().processor
            assert proc is not None
            wait_until(
                lambda: proc.exported >= 3, 10, lambda: f"3 spans exported ({proc.exported})"
            )
            guard.shutdown()
        wait_until(lambda: len(box["sink"].runs) == 1, 10)
