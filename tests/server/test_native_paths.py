"""``guard.native_paths()``: which of the four native fast paths run, the ``GuardAdmin.Stats``
figures that carry the same answer, and the one warning ``otel-guard serve`` logs at start when
any of them runs pure-Python."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import grpc
import pytest

import guard
from guard import _native
from guard.policy import use_native
from guard.server import GuardServer
from guard.server.decode import _nativedecode
from guard.store import _rows
from guard.v1 import guard_pb2 as pb
from guard.v1 import guard_pb2_grpc

from .conftest import config

PATHS = ("policy", "decode", "applier", "rows")
ALL_OFF = dict.fromkeys(PATHS, False)


def test_the_dev_install_runs_all_four_native_paths():
    # the dev install compiles every extension; one it skipped must fail here, not run slower
    assert guard.native_paths() == dict.fromkeys(PATHS, True)
    assert _native.native_built() == dict.fromkeys(PATHS, True)
    assert "native_paths" in guard.__all__
    assert set(_native.NATIVE_PATHS) == set(PATHS)


@pytest.fixture
def pure_paths(monkeypatch):
    """Every native path off, the way ``OTEL_GUARD_PURE_PYTHON=1`` turns them off; the
    settings and the warned-once flag are restored afterwards."""
    monkeypatch.setattr(_native, "_warned", False)
    before = (use_native(False), _nativedecode.set_enabled(False), _rows.use_native(False))
    yield
    use_native(before[0])
    _nativedecode.set_enabled(before[1])
    _rows.use_native(before[2])


def _warnings(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "guard.native" and r.levelno == logging.WARNING]


async def test_pure_paths_warn_once_and_show_in_stats(pure_paths, caplog, sink):
    assert guard.native_paths() == ALL_OFF
    with caplog.at_level(logging.WARNING, logger="guard.native"):
        first = _native.warn_pure_paths()
        again = _native.warn_pure_paths()
    assert again is None and [r.getMessage() for r in _warnings(caplog)] == [first]
    assert first.startswith("native fast paths not running (turned off: policy, decode, applier")
    assert "span ingest runs at about a third of the speed (0.32x" in first
    assert "unset OTEL_GUARD_PURE_PYTHON" in first
    async with GuardServer(config(), listen="127.0.0.1:0", sink=sink) as srv:
        figures = srv.figures()
    assert {name: figures[f"native_{name}"] for name in PATHS} == dict.fromkeys(PATHS, 0.0)
    assert figures["native_missing"] == 4.0


def test_paths_not_built_name_the_fix(pure_paths, monkeypatch, caplog):
    # what an sdist installed without a compiler has: no extension file at all
    monkeypatch.setattr(_native, "native_built", lambda: dict(ALL_OFF))
    with caplog.at_level(logging.WARNING, logger="guard.native"):
        message = _native.warn_pure_paths()
    assert message == (
        "native fast paths not running (not built: policy, decode, applier, rows): span ingest "
        "runs at about a third of the speed (0.32x of a binary wheel's); install a binary wheel "
        "or build with a C compiler"
    )
    assert len(_warnings(caplog)) == 1


def test_some_paths_missing_say_which_and_why():
    paths = {"policy": True, "decode": False, "applier": False, "rows": True}
    built = {"policy": True, "decode": False, "applier": True, "rows": True}
    message = _native.pure_paths_message(paths, built)
    assert message is not None
    assert "(not built: decode; turned off: applier)" in message
    assert (
        "span ingest runs slower (about a third of the speed, 0.32x, with none native)" in message
    )
    assert _native.pure_paths_message(dict.fromkeys(PATHS, True), built) is None


def test_without_the_server_extra_built_extensions_answer(monkeypatch):
    # decode, applier and rows import the server extra's dependencies; without them the
    # answer is whether the extension is built for this interpreter
    def missing() -> bool:
        raise ImportError("No module named 'grpc_health'")

    monkeypatch.setitem(_native._RUNNING, "decode", missing)
    assert guard.native_paths()["decode"] is True  # the dev install built it
    monkeypatch.setattr(_native, "native_built", lambda: dict(ALL_OFF))
    assert guard.native_paths()["decode"] is False


def test_serve_warns_once_at_start_and_stats_counts_the_missing():
    env = dict(os.environ, OTEL_GUARD_PURE_PYTHON="1")
    cmd = [sys.executable, "-m", "guard.cli", "serve", "--listen", "127.0.0.1:0", "--no-store"]
    cmd += ["--http-listen", "none", "--json", "--log-level", "WARNING"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line, "the guard did not start"
        with grpc.insecure_channel(json.loads(line)["address"]) as channel:
            stats = guard_pb2_grpc.GuardAdminStub(channel).Stats(pb.StatsRequest(), timeout=10)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        proc.stdout.close()  # type: ignore[union-attr]
    figures = dict(stats.figures)
    assert figures["native_missing"] == 4.0 and figures["native_applier"] == 0.0
    warned = [line for line in err.splitlines() if "native fast paths not running" in line]
    assert len(warned) == 1 and " WARNING guard.native: " in warned[0], err
