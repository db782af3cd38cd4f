"""Fuzz: raw bytes and structured mutations into the guard's real fast parse path and its real
servicers (the bounded run of ``make test``; ``benchmarks/fuzz_soak.py`` runs >= 1M).

In process, bodies go through ``_decode.decode_slices`` (the native decoder, falling back to the
reference for what it does not answer for) and ``Registry.ingest``, and agent messages through the wire checks into the registry
(tests/server/fuzzing.py); over grpc, raw bodies reach OTLP Export, GuardControl.Attach,
GuardAdmin and Health on a real guard with auth. Checked per message or batch: nothing but a
``GuardError`` escapes, no UNKNOWN / INTERNAL, no traceback or ERROR logged, health answers
afterwards, no non-finite value in a run budget or tenant window, runs under their cap.
"""

from __future__ import annotations

import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guard.errors import InvalidInput
from guard.server import ServerThread
from guard.server._decode import decode_slices
from guard.server._otlp import CHUNK_SPANS

from .conftest import AUTH, AUTH_ENV
from .fuzz_remote import Remote, drive
from .fuzzing import Fuzzer, InProcess, fuzz_config, violations

IN_PROCESS_MESSAGES = 3000
OVER_GRPC_MESSAGES = 400


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=1024))
def test_random_bytes_reach_the_fast_parse_path(data):
    """Raw bytes into the decoder (native, then the reference): either a request, or
    InvalidInput (the handler's INVALID_ARGUMENT); never another exception."""
    try:
        for _ in decode_slices(data, CHUNK_SPANS):
            pass
    except InvalidInput:
        pass


@pytest.mark.parametrize("seed", [1, 2])
def test_in_process_fuzz_keeps_state_sane(seed):
    f = Fuzzer(seed)
    target = InProcess(fuzz_config(max_runs=60))
    for i in range(IN_PROCESS_MESSAGES // 2):
        who = f.rng.randrange(6)
        if f.rng.random() < 0.6:
            target.export(f.otlp_body(), who)
        else:
            target.control(f.agent_body(), who)
        if i % 100 == 0:
            target.sweep()
            assert violations(target.registry) == [], f"after message {i}"
    assert violations(target.registry) == []
    assert target.refused > 0  # the fuzzer does reach the refusals


def test_fuzz_over_grpc_never_unknown_nor_a_traceback(caplog):
    caplog.set_level(logging.WARNING)
    with ServerThread(fuzz_config(max_runs=60, auth=AUTH), environ=AUTH_ENV) as srv:
        remote = Remote(srv.address, ["acme-secret", "globex-secret", "admin-secret", None, "bad"])
        f = Fuzzer(7)
        sent = 0
        while sent < OVER_GRPC_MESSAGES:
            sent += drive(remote, f, 50)
            assert remote.crashes == []
            assert remote.serving()
            assert srv.call(lambda: violations(srv.server.registry)) == []
        remote.close()
    logged = [
        f"{r.name}: {r.getMessage()[:200]}"
        for r in caplog.records
        if (r.levelno >= logging.ERROR or r.exc_info) and r.name.startswith(("guard", "grpc"))
    ]
    assert logged == []
    assert {"OK", "INVALID_ARGUMENT"} <= set(remote.codes)  # both sides of the line reached
