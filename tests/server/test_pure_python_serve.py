"""``OTEL_GUARD_PURE_PYTHON=1``: ``otel-guard serve`` runs the pure-Python reference paths (the
span decoder, fingerprints and loop detection), and the guard still counts the same spans.
Which paths run is in ``GuardAdmin.Stats`` (``native_decode``, ``native_policy``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as otlp_grpc

from guard.policy import native_available
from guard.server.decode import _nativedecode
from guard.v1 import guard_pb2 as pb
from guard.v1 import guard_pb2_grpc

from .conftest import model_span, request, trace_id_of


def _serve(pure: bool) -> tuple[subprocess.Popen[str], str]:
    env = {k: v for k, v in os.environ.items() if k != "OTEL_GUARD_PURE_PYTHON"}
    if pure:
        env["OTEL_GUARD_PURE_PYTHON"] = "1"
    cmd = [sys.executable, "-m", "guard.cli", "serve", "--listen", "127.0.0.1:0", "--no-store"]
    cmd += ["--http-listen", "none", "--json", "--log-level", "WARNING"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    assert line, "the guard did not start"
    return proc, json.loads(line)["address"]


@pytest.mark.parametrize("pure", [False, True])
def test_pure_python_env_switches_the_paths_and_counts_the_same(pure):
    proc, address = _serve(pure)
    try:
        with grpc.insecure_channel(address) as channel:
            spans = [model_span("r-1", trace_id_of(1), tokens_in=30 + i) for i in range(3)]
            otlp_grpc.TraceServiceStub(channel).Export(request(*spans), timeout=10)
            stats = guard_pb2_grpc.GuardAdminStub(channel).Stats(pb.StatsRequest(), timeout=10)
        figures = dict(stats.figures)
        assert figures["spans"] == 3.0 and figures["observations"] == 3.0
        assert figures["native_decode"] == float(not pure and _nativedecode.available())
        assert figures["native_policy"] == float(not pure and native_available())
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stdout.close()  # type: ignore[union-attr]
