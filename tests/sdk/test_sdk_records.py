"""Exactly-once termination records, SDK side: every RunEnded is kept until the guard's
RecordAck and sent again after each reconnect; shutdown waits (bounded) for the
acknowledgements, also while disconnected, and names the runs it could not deliver; the
re-registration snapshot ``(usage, span_seq)`` matches the ``guard.seq`` numbers on the spans.
"""

from __future__ import annotations

import logging
import threading

import pytest
from _sdk_fake_guard import FakeGuard
from _wait import wait_until
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from test_sdk_control import _settings as _control_settings

import guard
from guard.errors import ConfigError
from guard.sdk._api import reset
from guard.sdk._runtime import get_runtime


def _settings(g: FakeGuard, **kw):
    return _control_settings(g, **{"shutdown_ack_timeout_s": 5.0, **kw})


def _ended(g: FakeGuard, run_id: str) -> int:
    return sum(1 for o in g.of("run_ended") if o.outcome.run_id == run_id)


def _one_run() -> str:
    @guard.run(agent="bot", max_steps=2)
    def f() -> None:
        while True:
            with guard.step() as step:
                step.model_call(model="gpt-4.1", input_tokens=10, output_tokens=1)

    with pytest.raises(guard.RunStopped) as info:
        f()
    return info.value.outcome.run_id


def test_an_unacknowledged_record_is_resent_after_every_reconnect_until_acked() -> None:
    g = FakeGuard(ack_records=False)  # the guard died before the record reached its WAL
    try:
        guard.configure(**_settings(g))
        rid = _one_run()
        assert g.wait(lambda m: m.WhichOneof("body") == "run_ended")
        g.drop_stream()
        # after the next Hello, the same record again
        assert g.wait(lambda m: _ended(g, rid) >= 2, timeout=10)
        hellos = [i for i, m in enumerate(g.received) if m.WhichOneof("body") == "hello"]
        resent = [
            i
            for i, m in enumerate(g.received)
            if m.WhichOneof("body") == "run_ended" and m.run_ended.outcome.run_id == rid
        ]
        assert len(hellos) >= 2 and resent[1] > hellos[1]
        g.ack_records = True  # now the guard holds it: acked, and never sent again
        g.drop_stream()
        assert g.wait(lambda m: _ended(g, rid) >= 3, timeout=10)
        control = get_runtime().control
        assert control is not None
        wait_until(lambda: len(control.unacked) == 0, 10)
        # the next Hello tells a (restarted) guard the run is over
        g.drop_stream()
        h = g.wait(lambda m: m.WhichOneof("body") == "hello" and rid in m.hello.ended_runs)
        assert h is not None
        n = _ended(g, rid)
        guard.shutdown()
        assert _ended(g, rid) == n
    finally:
        reset()
        g.stop()


def test_shutdown_while_the_guard_is_down_waits_and_delivers_when_it_returns() -> None:
    g = FakeGuard()
    port = g.port
    guard.configure(**_settings(g, shutdown_ack_timeout_s=20.0))
    try:
        g.stop()  # the guard dies; the run ends while it is down
        rid = _one_run()
        back: list[FakeGuard] = []
        # back after longer than the old 2 s stop bound
        timer = threading.Timer(2.5, lambda: back.append(FakeGuard(port=port)))
        timer.start()
        guard.shutdown()  # waits for the ack, reconnecting meanwhile
        timer.join()
        assert back and _ended(back[0], rid) >= 1
        assert any(m.WhichOneof("body") == "hello" for m in back[0].received)
    finally:
        reset()
        for x in back:
            x.stop()


def test_shutdown_gives_up_after_its_bound_and_names_the_runs(caplog) -> None:
    g = FakeGuard(ack_records=False)
    try:
        guard.configure(**_settings(g, shutdown_ack_timeout_s=0.3))
        rid = _one_run()
        with caplog.at_level(logging.WARNING, logger="guard.sdk.control"):
            guard.shutdown()
        lines = [r.getMessage() for r in caplog.records if rid in r.getMessage()]
        assert len(lines) == 1 and "did not acknowledge" in lines[0], lines
    finally:
        reset()
        g.stop()


def test_shutdown_ack_timeout_is_validated_and_read_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("OTEL_GUARD_SHUTDOWN_ACK_TIMEOUT_S", "2.5")
    try:
        assert guard.configure().shutdown_ack_timeout_s == 2.5
        with pytest.raises(ConfigError, match="shutdown_ack_timeout_s"):
            guard.configure(shutdown_ack_timeout_s=-1)
        monkeypatch.setenv("OTEL_GUARD_SHUTDOWN_ACK_TIMEOUT_S", "soon")
        with pytest.raises(ConfigError, match="shutdown_ack_timeout_s"):
            guard.configure()
    finally:
        monkeypatch.delenv("OTEL_GUARD_SHUTDOWN_ACK_TIMEOUT_S")
        reset()


def _seqs(g: FakeGuard, run_id: str) -> list[int]:
    out = []
    for raw in g.traces.raw:
        req = otlp.ExportTraceServiceRequest.FromString(raw)
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for sp in ss.spans:
                    attrs = {kv.key: kv.value for kv in sp.attributes}
                    rid = attrs["guard.run.id"].string_value if "guard.run.id" in attrs else ""
                    if rid == run_id and "guard.seq" in attrs:
                        out.append(attrs["guard.seq"].int_value)
    return out


def test_the_re_registration_snapshot_matches_the_span_numbers() -> None:
    g = FakeGuard()
    release = threading.Event()
    box: dict = {}
    try:
        guard.configure(**_settings(g))

        @guard.run(agent="bot", max_steps=50)
        def f() -> None:
            box["rid"] = guard.current_run().run_id
            for _ in range(3):
                with guard.step() as step:
                    step.model_call(model="gpt-4.1", input_tokens=10, output_tokens=1)
                    step.tool_call("search", {"q": "x"}, result=1)
            release.wait(10)

        th = threading.Thread(target=f)
        th.start()
        wait_until(lambda: "rid" in box, 10)
        rid = box["rid"]
        wait_until(lambda: len(_seqs(g, rid)) == 9, 10)  # 3 x (step, model call, tool call)
        assert sorted(_seqs(g, rid)) == list(range(1, 10))  # each counted span numbered once
        before = len(g.of("hello"))
        g.drop_stream()
        wait_until(lambda: len(g.of("hello")) > before, 10)
        h = g.of("hello")[before]  # the re-registration after the reconnect
        live = next(r for r in h.live_runs if r.run_id == rid)
        assert live.span_seq == 9
        assert (live.usage.steps, live.usage.model_calls, live.usage.tool_calls) == (3, 3, 3)
        release.set()
        th.join(5)
    finally:
        release.set()
        reset()
        g.stop()
