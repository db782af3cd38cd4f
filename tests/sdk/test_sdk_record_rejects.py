"""A termination record the real guard refuses, SDK side: the agent stops resending it (also
across reconnects), logs one WARNING naming the run and the reason, counts it, and the
records of its other runs, on the same stream, are stored."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from _sdk_real_guard import guard_in_thread
from _wait import wait_until

import guard
from guard.sdk._runtime import get_runtime

pytest.importorskip("guard.server")


@pytest.fixture
def counted_guard(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A real guard that counts, by run id, every RunEnded it reads."""
    import guard.server.control._stream as control

    sends: Counter[str] = Counter()
    real = control.apply_message

    def counting(registry: Any, session: Any, msg: Any, body: Any, principal: Any) -> None:
        if body == "run_ended":
            sends[msg.run_ended.outcome.run_id] += 1
        real(registry, session, msg, body, principal)

    monkeypatch.setattr(control, "apply_message", counting)
    with guard_in_thread({}) as box:
        box["sends"] = sends
        yield box


def _good() -> str:
    @guard.run(agent="bot")
    def f() -> str:
        with guard.step() as step:
            step.model_call(model="gpt-4.1", input_tokens=10, output_tokens=1)
        return guard.current_run().run_id

    return f()


def _poison() -> str:
    """A run whose bug reports a cost no price book gives: its record is out of bounds."""

    @guard.run(agent="bot")
    def f() -> str:
        with guard.step() as step:
            step.model_call(model="gpt-4.1", input_tokens=10, output_tokens=1, cost_usd=1e12)
        return guard.current_run().run_id

    return f()


def _drop_stream() -> None:
    """End the SDK's control stream from under it (as a network blip would)."""
    control = get_runtime().control
    loop = control._loop
    loop.call_soon_threadsafe(lambda: control._call is not None and control._call.cancel())


def test_a_refused_record_is_not_resent_and_the_other_runs_are_stored(
    counted_guard: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="guard.sdk.control")
    sink, sends = counted_guard["sink"], counted_guard["sends"]
    address = f"127.0.0.1:{counted_guard['port']}"
    guard.configure(
        endpoint=address,
        tenant="acme",
        admit_timeout_ms=10_000,
        reconnect_min_s=0.05,
        reconnect_max_s=0.2,
        shutdown_ack_timeout_s=5.0,
    )
    try:
        first = _good()
        bad = _poison()
        others = [_good() for _ in range(3)]
        good = [first, *others]
        wait_until(lambda: guard.stats().get("control_records_rejected") == 1, 10, "the Reject")
        wait_until(lambda: all(sends[r] >= 1 for r in good), 10, "every record sent")
        for _ in range(3):  # reconnects resend every unacknowledged record: not this one
            welcomes = guard.stats().get("control_welcomes", 0)
            _drop_stream()
            wait_until(lambda w=welcomes: guard.stats()["control_welcomes"] > w, 10, "reconnect")
        others.append(_good())  # a run on the new stream
        stats = guard.stats()
        guard.shutdown()
    finally:
        guard.shutdown()
    assert sends[bad] == 1
    assert stats["control_records_rejected"] == 1
    stored = {o.run_id for o in sink.runs if o.decided_by.value == "sdk"}
    assert stored == {first, *others}
    assert [d[1] for d in sink.dead_letters] == [bad]
    warnings = [
        r for r in caplog.records if r.name == "guard.sdk.control" and bad in r.getMessage()
    ]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert "usage.cost_usd" in warnings[0].getMessage()
    assert not any("unacknowledged" in r.getMessage() for r in caplog.records)


def test_a_reject_for_a_record_not_held_changes_nothing() -> None:
    from guard.sdk._records import PendingRecords

    pending = PendingRecords()
    pending.add("r1", object())
    assert not pending.reject("other", "why", 3)
    assert pending.run_ids() == ["r1"]
    assert pending.reject("r1", "why", 3) and len(pending) == 0
    assert pending.wait_empty(0.01)
