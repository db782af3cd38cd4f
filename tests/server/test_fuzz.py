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

import grpc
import pytest
from _hyp import examples
from _wait import wait_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guard.errors import InvalidInput
from guard.server import MemorySink, ServerThread
from guard.server.decode._decode import decode_slices
from guard.server.otlp._grpc import CHUNK_SPANS
from guard.v1 import guard_pb2 as pb

from .conftest import AUTH, AUTH_ENV
from .fuzz_remote import Remote, drive
from .fuzz_target import InProcess, violations
from .fuzzing import BAD_BATCHES, BATCHES, Fuzzer, fuzz_config

IN_PROCESS_MESSAGES = 3000
OVER_GRPC_MESSAGES = 400


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
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


@pytest.mark.parametrize("kind", BATCHES)
def test_each_batch_shape_in_process(kind):
    """A bad AgentBatch is refused whole (a GuardError, counted) and registers none of its
    runs; a valid one registers them; odd content is refused or applied, never a crash."""
    f = Fuzzer(11)
    target = InProcess(fuzz_config(max_runs=60))
    hello = pb.AgentMessage(hello=pb.Hello(process_id="p", tenant="acme"))
    for _ in range(5):
        target.control(hello.SerializeToString(), 0)  # a fresh session each time
        msg, fresh = f.batch(kind)
        target.control(msg.SerializeToString(), 0)
        # registered: tracked, or ended by the batch (its record written)
        seen = [rid in target.registry.runs or target.sink.run(rid) for rid in fresh]
        if kind in BAD_BATCHES:
            assert not any(seen)
        elif kind == "valid":
            assert all(seen)
    if kind != "odd":  # odd content may hold an empty message, which refuses it whole
        assert target.batches_refused == (5 if kind in BAD_BATCHES else 0)
    assert target.refusals_that_changed == 0
    assert violations(target.registry) == []


@pytest.mark.parametrize("kind", BAD_BATCHES)
def test_a_bad_batch_over_grpc_is_refused_whole_with_a_clear_status(kind):
    """The real servicer: the batch is answered with a Reject carrying its status and a
    one-line reason that says why, the stream goes on, and not one run of the batch was
    registered; a valid batch on the same guard registers its runs (so the check can fail)."""
    sink = MemorySink()
    with ServerThread(fuzz_config(max_runs=60, auth=AUTH), environ=AUTH_ENV, sink=sink) as srv:
        remote = Remote(srv.address, ["acme-secret"])
        f = Fuzzer(5)

        def seen(run_ids: list[str]) -> list[bool]:  # tracked, or ended (its record written)
            runs = srv.call(lambda: set(srv.server.registry.runs))
            return [rid in runs or sink.run(rid) is not None for rid in run_ids]

        hello = pb.AgentMessage(hello=pb.Hello(process_id="p", accepts_batches=True))
        msg, fresh = f.batch(kind)
        call = remote.channel.stream_stream("/guard.v1.GuardControl/Attach")
        bodies = iter([hello.SerializeToString(), msg.SerializeToString()])
        got = [pb.GuardMessage.FromString(raw) for raw in call(bodies, metadata=remote._md(0))]
        flat = [m for g in got for m in (g.batch.messages if g.HasField("batch") else [g])]
        [refused] = [m.reject for m in flat if m.HasField("reject")]
        assert refused.body == "batch"
        code = next(c for c in grpc.StatusCode if c.value[0] == refused.code)
        assert code.name == BATCHES[kind]
        reason = refused.reason
        assert "\n" not in reason and ("batch" in reason or "message" in reason), reason
        assert not any(seen(fresh))

        ok, ok_fresh = f.batch("valid")  # the same stream shape, accepted
        assert remote.attach([hello.SerializeToString(), ok.SerializeToString()], 0).name == "OK"
        wait_until(lambda: all(seen(ok_fresh)), 10, "the valid batch's runs")
        remote.close()
