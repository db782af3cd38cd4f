"""A control message the real guard refuses on its own (a Reject), SDK side: the agent logs one
WARNING naming the run and the reason, counts it, does not send it again; a refused
RunStarted lets its run go on at once under its local limits (as without a guard: no wait
for an admission that never comes, and no Hello after a reconnect carrying it, which the
guard would refuse whole); a refused AllowanceRequest fails open. The stream stays up and
the messages around the refused one take effect."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from _sdk_real_guard import guard_in_thread
from _wait import wait_until

import guard
from guard.sdk._run import current_run_or_none
from guard.sdk._runtime import get_runtime

pytest.importorskip("guard.server")

LONG_AGENT = "a" * 300  # over the guard's 256-character bound: its RunStarted is refused


@pytest.fixture
def real_guard() -> Iterator[dict[str, Any]]:
    with guard_in_thread({}) as box:
        guard.configure(
            endpoint=f"127.0.0.1:{box['port']}",
            tenant="acme",
            admit_timeout_ms=10_000,  # a run waiting on an admission that never comes: 10 s
            reconnect_min_s=0.05,
            reconnect_max_s=0.2,
            shutdown_ack_timeout_s=5.0,
        )
        try:
            yield box
        finally:
            guard.shutdown()


def _run(agent: str) -> str:
    @guard.run(agent=agent)
    def f() -> str:
        with guard.step() as step:
            step.model_call(model="gpt-4.1", input_tokens=10, output_tokens=1)
        return guard.current_run().run_id

    return f()


def _warnings(caplog: pytest.LogCaptureFixture, needle: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "guard.sdk.control" and needle in r.getMessage()]


def test_a_refused_run_started_goes_on_at_once_and_the_runs_around_it_are_guarded(
    real_guard: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="guard.sdk.control")
    sink = real_guard["sink"]
    first = _run("bot")
    t0 = time.monotonic()
    bad = _run(LONG_AGENT)
    waited = time.monotonic() - t0
    last = _run("bot")
    stats = guard.stats()
    guard.shutdown()
    assert waited < 5.0, f"the refused run waited {waited:.1f}s for an admission"
    assert stats["control_messages_rejected"] == 1
    assert stats["control_rejected_run_started"] == 1
    assert stats.get("control_admit", 0) >= 2 or stats.get("control_batches_in", 0) >= 1
    [warning] = [r for r in _warnings(caplog, bad) if "run_started" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert "run_started.agent has 300 chars (max 256)" in warning.getMessage()
    assert "local limits" in warning.getMessage()
    # the good runs' records are stored; the refused run's record is dead-lettered, not lost
    assert {first, last} <= {o.run_id for o in sink.runs}
    assert [d[1] for d in sink.dead_letters] == [bad]


def test_a_refused_run_is_left_out_of_the_hello_after_a_reconnect(
    real_guard: dict[str, Any],
) -> None:
    """Without that, the Hello after every reconnect would carry it and be refused whole:
    the process would never be guarded again."""
    release, inside = threading.Event(), threading.Event()
    control = get_runtime().control

    @guard.run(agent=LONG_AGENT)
    def held() -> str:
        inside.set()
        release.wait(20)
        return guard.current_run().run_id

    th = threading.Thread(target=held)
    th.start()
    try:
        assert inside.wait(10)
        wait_until(lambda: guard.stats().get("control_rejected_run_started") == 1, 10, "Reject")
        welcomes = guard.stats()["control_welcomes"]
        assert guard.stats()["control_messages_rejected"] == 1  # counted once
        loop = control._loop
        loop.call_soon_threadsafe(lambda: control._call is not None and control._call.cancel())
        wait_until(lambda: guard.stats()["control_welcomes"] > welcomes, 10, "the reconnect")
        good = _run("bot")  # guarded on the new stream
        wait_until(lambda: good in {o.run_id for o in real_guard["sink"].runs}, 10, "record")
        assert guard.stats()["control_rejected_run_started"] == 1  # not refused again
    finally:
        release.set()
        th.join(10)


def test_a_refused_allowance_request_fails_open_and_the_next_one_is_answered(
    real_guard: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="guard.sdk.control")
    desk = get_runtime().control.allowances
    answers: dict[str, Any] = {}

    @guard.run(agent="bot")
    def f() -> str:
        run = current_run_or_none()
        wait_until(lambda: get_runtime().control.connected.is_set(), 10, "connected")
        bad = desk.request(run, math.inf, 0)
        answers["bad"] = bad.result(timeout=5)
        answers["good"] = desk.request(run, 0.5, 10).result(timeout=5)
        return run.run_id

    rid = f()
    assert answers["bad"] is None  # no ceilings: the call goes on as without a guard
    assert answers["good"] is not None
    stats = guard.stats()
    assert stats["control_rejected_allowance_request"] == 1
    [warning] = _warnings(caplog, "allowance_request")
    assert rid in warning.getMessage() and "cost_usd" in warning.getMessage()
