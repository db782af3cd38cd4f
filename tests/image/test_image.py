"""The built container image, run as the Helm chart runs it (``make image-test``).

The guard runs from the image as PID 1 of its own namespace, as the image's non-root user, on
a read-only root file system with its data directory as a volume (``_container``). A real
agent on the host (the SDK, as the README's quickstart uses it) runs against it: a runaway run
stopped by the guard's policy and a run cancelled with ``otel-guard cancel`` run from the
image. Then SIGTERM: the guard must drain and exit 0, and the runs' termination records must
be in the embedded store it leaves in the volume.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import socket
import threading
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from _container import Image, Process

import guard
from guard._version import __version__ as VERSION
from guard.cli._client import AdminClient
from guard.testing import FakeModel, ToolCall, run_agent_loop

ROOT = Path(__file__).resolve().parents[2]
DATA = "/var/lib/otel-guard"
ADMIN, ACME = "image-test-admin-token", "image-test-acme-token"
# The guard's policy: a lower step limit than the agent asks for, so the stop proves the
# policy came from the guard in the image (its Admit), and auth, as a non-loopback guard needs.
POLICY = """\
runs:
  max_steps: 4
auth:
  admin_token_env: OTEL_GUARD_ADMIN_TOKEN
  tenants:
    acme: {token_env: ACME_GUARD_TOKEN}
"""
GUARD_ENV = {
    "OTEL_GUARD_ADMIN_TOKEN": ADMIN,
    "ACME_GUARD_TOKEN": ACME,
    "OTEL_GUARD_HMAC_KEY": "image-test-hmac-key",
    "OTEL_GUARD_ID": "image-test",
}
DRAIN_S = 5.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _data_dir(tmp_path: Path) -> Path:
    """A volume for the data directory, owned by the image's user like the chart's fsGroup."""
    data = tmp_path / "data"
    data.mkdir()
    os.chown(data, 10001, 10001)
    return data


def _wait_serving(image: Image, guard_proc: Process, address: str | None = None) -> None:
    """Until ``otel-guard health`` run from the image says SERVING (the image's HEALTHCHECK
    command itself when ``address`` is None, in the guard's network namespace)."""
    deadline = time.monotonic() + 120
    while True:
        if guard_proc.popen.poll() is not None:
            code, out, err = guard_proc.wait(10)
            pytest.fail(f"the guard exited ({code}) before serving:\n{out}\n{err}")
        if address is None:
            code, out, err = image.healthcheck(join=guard_proc)
        else:
            code, out, err = image.run(["health", "--endpoint", address, "--timeout-s", "2"])
        if code == 0:
            assert out.strip().endswith("is SERVING"), out
            return
        assert time.monotonic() < deadline, f"never SERVING: {err}"
        time.sleep(0.5)


@contextlib.contextmanager
def _running(proc: Process) -> Iterator[Process]:
    try:
        yield proc
    finally:
        proc.kill()  # only when the test failed before stopping it


def test_image_configuration_matches_the_chart(image: Image) -> None:
    cfg = image.config
    values = yaml.safe_load((ROOT / "helm/otel-guard/values.yaml").read_text())
    chart = yaml.safe_load((ROOT / "helm/otel-guard/Chart.yaml").read_text())
    repository, _, tag = image.ref.rpartition(":")
    assert repository == values["image"]["repository"]
    assert tag == chart["appVersion"] == VERSION
    uid, gid = image.user()
    security = values["podSecurityContext"]
    assert uid == security["runAsUser"] == 10001 and gid == security["runAsGroup"] == 10001
    assert security["fsGroup"] == gid
    assert cfg["Entrypoint"] == values["image"]["command"] == ["otel-guard"]
    assert cfg["Cmd"][0] == "serve" and "0.0.0.0:4317" in cfg["Cmd"]
    ports = {values["guard"]["port"], values["guard"]["httpPort"], values["metrics"]["port"]}
    assert (
        set(cfg["ExposedPorts"])
        == {f"{p}/tcp" for p in ports}
        == {
            "4317/tcp",
            "4318/tcp",
            "9464/tcp",
        }
    )
    assert set(cfg["Volumes"]) == {values["guard"]["dataDir"]} == {DATA}
    assert cfg["StopSignal"] == "SIGTERM"
    assert cfg["Healthcheck"]["Test"] == [
        "CMD",
        *("otel-guard", "health", "--endpoint", "127.0.0.1:4317"),
    ]
    labels = cfg["Labels"]
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.title"] == "otel-guard"
    assert labels["org.opencontainers.image.source"].startswith("https://")
    assert labels["org.opencontainers.image.description"]
    assert labels["org.opencontainers.image.revision"] not in ("", "unknown")
    st = (image.root / DATA.lstrip("/")).stat()
    assert (st.st_uid, st.st_gid) == (uid, gid)


def test_image_contents(image: Image) -> None:
    """Non-root, the project's version, every native path, and nothing of the build."""
    code, out, err = image.run(["--version"])
    assert (code, out.strip()) == (0, f"otel-guard {VERSION}"), err
    code, out, err = image.run(["-c", "id -u; id -g"], entrypoint=["sh"])
    assert (code, out.split()) == (0, ["10001", "10001"]), err
    # The image's own python must not find a compiler, pip or headers on its PATH.
    path = dict(e.split("=", 1) for e in image.config["Env"])["PATH"].split(":")
    for tool in ("gcc", "cc", "c++", "g++", "cpp", "clang", "x86_64-linux-gnu-gcc", "pip"):
        found = [d for d in path if (image.root / d.lstrip("/") / tool).exists()]
        assert not found, f"{tool} in {found}"
    for top in ("usr/lib", "usr/libexec", "usr/local", "opt"):
        cc1 = [p for p in (image.root / top).rglob("cc1*") if p.is_file()]
        assert not cc1, cc1
    assert not list((image.root / "usr/include").glob("python3*/Python.h"))
    code, _, err = image.run(["-m", "pip", "--version"], entrypoint=["python3"])
    assert code != 0 and "No module named pip" in err, err
    caches = [p for p in image.root.rglob(".cache") if (p / "pip").exists()]
    assert not caches, caches
    # The C extensions pyproject.toml declares: compiled into the image, imported from it.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    names = [e["name"] for e in project["tool"]["setuptools"]["ext-modules"]]
    code, out, err = image.run(
        ["-c", f"import importlib; print(*[importlib.import_module(n).__file__ for n in {names}])"],
        entrypoint=["python3"],
    )
    assert code == 0, err
    files = out.split()
    assert len(files) == len(names) and all(f.startswith("/opt/otel-guard/") for f in files)


def _runaway() -> guard.RunStopped:
    """A runaway agent: the same search forever, a new result each time (no loop, no end)."""
    results = itertools.count()
    model = FakeModel.looping(ToolCall("search", {"q": "where is my refund"}))

    @guard.run(agent="runaway", max_steps=1000)  # the guard's policy allows 4
    async def agent() -> str:
        return await run_agent_loop(model, {"search": lambda q: f"result {next(results)}"})

    with pytest.raises(guard.RunStopped) as stop:
        asyncio.run(agent())
    return stop.value


def _cancelled(image: Image, address: str) -> guard.RunStopped:
    """A run waiting on a slow call, cancelled by ``otel-guard cancel`` run from the image."""
    box: dict[str, Any] = {}
    started = threading.Event()

    @guard.run(agent="sleepy")
    async def agent() -> None:
        box["run_id"] = guard.current_run().run_id
        started.set()
        async with guard.step():
            await asyncio.sleep(120)

    def main() -> None:
        try:
            asyncio.run(agent())
        except guard.RunStopped as stop:
            box["stop"] = stop

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    assert started.wait(30)
    run_id = box["run_id"]
    with AdminClient(address, token=ADMIN, timeout_s=5) as admin:
        deadline = time.monotonic() + 30
        while not any(r.run_id == run_id and r.connected for r in admin.list_runs().runs):
            assert time.monotonic() < deadline, "the run never reached the guard"
            time.sleep(0.2)
    env = {"OTEL_GUARD_ADMIN_TOKEN": ADMIN}
    args = ["cancel", "--run", run_id, "--reason", "image test", "--endpoint", address]
    code, out, err = image.run(args, env=env)
    assert code == 0, out + err
    thread.join(30)
    assert "stop" in box, "the cancelled run did not stop"
    return box["stop"]


def _report(image: Image, *args: str, **kw: Any) -> dict[str, Any]:
    code, out, err = image.run(["report", "--json", *args], **kw)
    assert code == 0, out + err
    return json.loads(out)


def test_guard_in_the_image_guards_a_real_agent(image: Image, tmp_path: Path) -> None:
    data, config = _data_dir(tmp_path), tmp_path / "config"
    config.mkdir()
    (config / "guard.yaml").write_text(POLICY)
    grpc_port, http_port, metrics_port = _free_port(), _free_port(), _free_port()
    address = f"127.0.0.1:{grpc_port}"
    # The chart's command and arguments (templates/deployment.yaml), on loopback ports.
    args = ["serve", "--listen", address, "--http-listen", f"127.0.0.1:{http_port}"]
    args += ["--config", "/etc/otel-guard/guard.yaml", "--data-dir", DATA]
    args += ["--drain-s", str(DRAIN_S), "--log-level", "INFO"]
    args += ["--metrics-listen", f"127.0.0.1:{metrics_port}", "--metrics-top-tenants", "20"]
    volumes = [(data, DATA, "rw"), (config, "/etc/otel-guard", "ro")]
    proc = image.spawn(args, env=GUARD_ENV, volumes=volumes)
    with _running(proc):
        assert proc.namespace_pid() == 1
        _wait_serving(image, proc, address)

        guard.configure(
            endpoint=address,
            tenant="acme",
            token=ACME,
            hmac_key=GUARD_ENV["OTEL_GUARD_HMAC_KEY"],
            fail_closed=True,  # a run the guard does not admit does not start
            admit_timeout_ms=10_000,
        )
        try:
            runaway = _runaway().outcome
            assert (runaway.reason, runaway.steps) == ("max_steps", 4), runaway
            cancelled = _cancelled(image, address).outcome
            assert (cancelled.status, cancelled.reason) == ("cancelled", "operator_cancel")
            assert cancelled.decided_by == "operator"
        finally:
            guard.shutdown()  # flushes the spans and waits for the records' acks
            from guard.sdk._api import reset

            reset()

        # The OTLP/HTTP receiver and the metrics endpoint answer too.
        req = urllib.request.Request(
            f"http://127.0.0.1:{http_port}/v1/traces",
            data=b"",
            headers={"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {ACME}"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            assert b'guard_id="image-test"' in r.read()

        env = {"OTEL_GUARD_ADMIN_TOKEN": ADMIN}
        deadline = time.monotonic() + 30
        while _report(image, "--endpoint", address, env=env)["total_runs"] < 2:
            assert time.monotonic() < deadline, "the guard never reported the two runs"
            time.sleep(0.5)

        stopping = time.monotonic()
        proc.signal(signal.SIGTERM)
        code, out, err = proc.wait(DRAIN_S + 20)
        took = time.monotonic() - stopping
    assert code == 0, f"exit {code}\n{out}\n{err}"
    assert "draining" in err and took < DRAIN_S + 10, (took, err)
    # Flushed: a clean close leaves no write-ahead log segment and an empty spool (a killed
    # guard leaves its unwritten records there, for the next start to replay).
    assert not list((data / "store/wal").iterdir())
    assert (data / "store/spool.log").stat().st_size == 0

    # The records are in the embedded store the guard left in the volume: read it from the
    # image with no guard running (the endpoint is closed now), and draw the chart too.
    closed = f"127.0.0.1:{grpc_port}"
    chart = f"{DATA}/report.png"
    report = _report(
        image, "--endpoint", closed, "--data-dir", DATA, "--chart", chart, volumes=[volumes[0]]
    )
    assert report["meta"]["source"] == f"store {DATA}", report["meta"]
    reasons = {row["reason"]: row["runs"] for row in report["rows"]}
    assert reasons == {"max_steps": 1, "operator_cancel": 1}, report["rows"]
    assert (data / "report.png").read_bytes().startswith(b"\x89PNG")


def test_default_command_and_healthcheck(image: Image, tmp_path: Path) -> None:
    """The image's own command, in a network namespace of its own as in a pod: it listens on
    0.0.0.0 with the default policy's auth, the HEALTHCHECK passes, calls without the admin
    token are refused, and SIGTERM stops it with exit status 0."""
    data = _data_dir(tmp_path)
    volumes = [(data, DATA, "rw")]
    env = {"OTEL_GUARD_ADMIN_TOKEN": ADMIN}
    proc = image.spawn(None, env=env, volumes=volumes, net=True)
    with _running(proc):
        assert proc.namespace_pid() == 1
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert b"serve" in cmdline and b"0.0.0.0:4317" in cmdline
        _wait_serving(image, proc)
        code, out, err = image.run(["runs", "--endpoint", "127.0.0.1:4317"], join=proc)
        assert code == 1 and "UNAUTHENTICATED" in err, out + err
        code, out, err = image.run(["runs", "--json"], join=proc, env=env)
        assert code == 0 and json.loads(out)["total"] == 0, out + err
        proc.signal(signal.SIGTERM)
        code, out, err = proc.wait(30)
    assert code == 0, f"exit {code}\n{out}\n{err}"


def test_runtime_is_faithful(image: Image) -> None:
    """The runtime the tests use enforces what the chart sets: a read-only root file system
    but for /tmp and the volumes, and no way back to root."""
    script = "touch /opt/x 2>/dev/null && echo rw; touch /tmp/x && echo tmp; id -u"
    code, out, err = image.run(["-c", script], entrypoint=["sh"])
    assert (code, out.split()) == (0, ["tmp", "10001"]), err
