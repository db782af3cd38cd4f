"""The control client and batches: it reads a GuardBatch, and writes what is ready at once as
one AgentBatch to a guard whose Welcome says it reads them (never to one that does not)."""

from __future__ import annotations

import threading

import pytest
from _sdk_fake_guard import FakeGuard
from _wait import wait_until

import guard
from guard.policy import Limits
from guard.sdk._runtime import get_runtime
from guard.testing import capture_spans
from guard.v1 import guard_pb2 as pb
from guard.wire import limits_to_pb


def _settings(g: FakeGuard, **kw):
    base = dict(
        endpoint=g.endpoint,
        tenant="acme",
        admit_timeout_ms=2000,
        reconnect_min_s=0.05,
        reconnect_max_s=0.2,
        heartbeat_interval_ms=60_000,  # no heartbeat in the way of the counted messages
    )
    return {**base, **kw}


def test_an_admit_inside_a_guard_batch_is_applied_and_not_acked() -> None:
    def decide(rs: pb.RunStarted) -> pb.GuardMessage:
        admit = pb.Admit(
            run_id=rs.run_id, request_id=rs.request_id, effective=limits_to_pb(Limits(max_steps=2))
        )
        policy = pb.GuardMessage(command_id=900, policy=pb.Policy(version="v1"))
        inner = [policy, pb.GuardMessage(command_id=901, admit=admit)]
        return pb.GuardMessage(batch=pb.GuardBatch(messages=inner))

    fake = FakeGuard(decide)
    try:
        with capture_spans(**_settings(fake)):

            @guard.run(agent="bot", max_steps=10)
            def f() -> None:
                while True:
                    with guard.step():
                        pass

            with pytest.raises(guard.RunStopped) as info:
                f()
            assert (info.value.outcome.reason, info.value.outcome.steps) == ("max_steps", 2)
            assert get_runtime().control.counters["batches_in"] == 1
        assert not fake.of("ack")  # an Admit is not acked (the Hello said accepts_batches)
    finally:
        fake.stop()


def _runs_while_the_control_loop_is_held(fake: FakeGuard, n: int) -> None:
    """``n`` runs start and end while the control thread's loop is blocked, so all of their
    messages are queued by the time it runs again (the admission wait fails open)."""
    client = get_runtime().control
    assert client.connected.wait(5)
    entered, release = threading.Event(), threading.Event()
    client._loop.call_soon_threadsafe(lambda: (entered.set(), release.wait(10)))
    assert entered.wait(5)

    @guard.run(agent="bot")
    def f() -> str:
        with guard.step():
            return "ok"

    try:
        for _ in range(n):
            assert f() == "ok"
    finally:
        release.set()
    ended = fake.wait(lambda m: len(fake.of("run_ended")) == n)
    assert ended is not None, fake.received


def test_what_is_ready_at_once_goes_as_one_batch_to_a_guard_that_reads_them() -> None:
    fake = FakeGuard(accepts_batches=True)
    try:
        with capture_spans(**_settings(fake, admit_timeout_ms=50)):
            _runs_while_the_control_loop_is_held(fake, 3)
            client = get_runtime().control
            kinds = [[m.WhichOneof("body") for m in b.messages] for b in fake.batches]
            assert kinds == [["run_started", "run_ended"] * 3]  # in order, one write
            # (no message arrives once the records are acked: a wait woken by arrivals would
            # sit out its whole timeout here)
            wait_until(lambda: len(client.unacked) == 0, 10, "the records acknowledged")
            assert client.counters["batches_out"] == 1
    finally:
        fake.stop()


def test_a_guard_that_did_not_say_so_gets_one_message_per_write() -> None:
    fake = FakeGuard()  # its Welcome does not set accepts_batches (an older guard)
    try:
        with capture_spans(**_settings(fake, admit_timeout_ms=50)):
            _runs_while_the_control_loop_is_held(fake, 3)
            assert not fake.batches
            assert get_runtime().control.counters["batches_out"] == 0
    finally:
        fake.stop()
