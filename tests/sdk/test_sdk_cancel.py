"""Cancellation really stops work: awaiting tasks, sync runs, process groups, callbacks."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time

import pytest
from _wait import wait_until, wait_until_async

import guard
from guard.sdk._clock import ManualClock
from guard.testing import SpanSink, capture_spans


def _group_alive(pgid: int) -> bool:
    """Any non-zombie process left in the group (orphans may linger as zombies in a container)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


async def test_cancel_from_another_thread_reaches_an_awaiting_task(sink: SpanSink) -> None:
    started = asyncio.Event()
    box: dict = {}

    @guard.run(agent="a")
    async def f() -> None:
        box["run"] = guard.current_run()
        async with guard.step():
            started.set()
            await asyncio.sleep(60)  # an in-flight model call

    task = asyncio.ensure_future(f())
    await started.wait()
    run = box["run"]
    threading.Thread(target=run.cancel, args=("user_cancel",)).start()
    # the step awaits a 60 s sleep: ending within a much shorter bound is the interrupt (the
    # latency is a figure: benchmarks/bench_sdk_waits.py local_cancel)
    with pytest.raises(guard.RunStopped) as info:
        await asyncio.wait_for(task, 10)
    o = info.value.outcome
    assert (o.status, o.reason, o.decided_by) == ("cancelled", "user_cancel", "sdk")
    assert not task.cancelled()  # converted into RunStopped, the task itself is not cancelled
    assert asyncio.current_task().cancelling() == 0


async def test_cancel_from_another_task_and_outer_tasks_survive(sink: SpanSink) -> None:
    box: dict = {}

    @guard.run(agent="a")
    async def f() -> None:
        box["run"] = guard.current_run()
        await asyncio.sleep(60)

    async def stopper() -> None:
        (await wait_until_async(lambda: box.get("run"), 10, "the run to start")).cancel()

    results = await asyncio.gather(f(), stopper(), return_exceptions=True)
    assert isinstance(results[0], guard.RunStopped)
    assert asyncio.current_task().cancelling() == 0  # the caller's task was not cancelled
    await asyncio.sleep(0)  # (a pending cancel of it would raise here)


async def test_outer_cancellation_is_not_swallowed(sink: SpanSink) -> None:
    box: dict = {}

    @guard.run(agent="a")
    async def f() -> None:
        box["run"] = guard.current_run()
        await asyncio.sleep(60)

    task = asyncio.ensure_future(f())
    await wait_until_async(lambda: "run" in box, 10, "the run to start")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert box["run"].outcome.status == "cancelled"


def test_sync_run_cancelled_flag_is_immediate_and_raised_at_next_call(sink: SpanSink) -> None:
    box: dict = {}
    gate = threading.Event()
    done = threading.Event()

    @guard.run(agent="a")
    def f() -> None:
        box["run"] = guard.current_run()
        with guard.step() as s:
            s.tool_call("t", {"i": 1}, result="kept")
        gate.set()
        done.wait(5)  # blocking work the SDK cannot interrupt
        box["flag_seen"] = guard.current_run().cancelled
        with guard.step():  # the next SDK call raises
            box["ran"] = True

    th = threading.Thread(target=lambda: box.setdefault("exc", _catch(f)))
    th.start()
    gate.wait(5)
    assert box["run"].cancel() is True
    assert box["run"].cancelled is True  # at once, while the run is still blocked
    done.set()
    th.join(5)
    assert box["flag_seen"] is True and "ran" not in box
    o = box["exc"].outcome
    assert o.reason == "user_cancel" and o.partial_result is True and o.tool_calls == 1
    assert box["run"].cancel() is False  # already over


def _catch(fn):
    try:
        fn()
    except guard.RunStopped as exc:
        return exc
    return None


def test_tracked_process_group_is_killed_on_cancel() -> None:
    with capture_spans(kill_grace_s=0.3):
        box: dict = {}

        @guard.run(agent="a")
        def f() -> None:
            run = guard.current_run()
            # A process tree: sh plus two sleeps, one ignoring SIGTERM (needs the SIGKILL).
            proc = subprocess.Popen(
                ["sh", "-c", "sleep 60 & (trap '' TERM; sleep 60) & wait"],
                start_new_session=True,
            )
            box["proc"] = run.track_process(proc)
            time.sleep(0.1)
            order: list[str] = []
            run.on_cancel(lambda: order.append(f"callback cancelled={run.cancelled}"))
            run.cancel("user_cancel")
            box["order"] = order
            run.raise_if_cancelled()

        with pytest.raises(guard.RunStopped):
            f()
        proc = box["proc"]
        assert box["order"] == ["callback cancelled=True"]
        wait_until(lambda: not _group_alive(proc.pid), 10, "the process group to be killed")
        proc.wait(1)


async def test_async_tracked_process_killed_and_task_interrupted() -> None:
    with capture_spans(kill_grace_s=0.3):
        box: dict = {}

        @guard.run(agent="a")
        async def f() -> None:
            proc = await asyncio.create_subprocess_exec("sleep", "60", start_new_session=True)
            box["proc"] = guard.current_run().track_process(proc)
            box["run"] = guard.current_run()
            await proc.wait()

        task = asyncio.ensure_future(f())
        (await wait_until_async(lambda: box.get("run"), 10, "the run to start")).cancel()
        with pytest.raises(guard.RunStopped):
            await task
        assert await asyncio.wait_for(box["proc"].wait(), 5) != 0


def test_on_cancel_after_cancel_runs_at_once_and_errors_are_contained(sink: SpanSink) -> None:
    calls = []

    @guard.run(agent="a")
    def f() -> None:
        run = guard.current_run()
        run.on_cancel(lambda: 1 / 0)  # a broken callback never breaks the cancel
        run.cancel()
        run.on_cancel(lambda: calls.append("late"))
        run.raise_if_cancelled()

    with pytest.raises(guard.RunStopped):
        f()
    assert calls == ["late"]


def test_timeout_and_remaining(clocked_sink: SpanSink, clock: ManualClock) -> None:
    box: dict = {}

    @guard.run(agent="a", deadline_s=10, max_steps=5, max_tool_calls=7, timeout_margin_s=0.5)
    def f() -> None:
        run = guard.current_run()
        with guard.step():
            clock.advance(1.25)
        box["rem"] = run.remaining()
        box["t_small"] = run.timeout(2.0)
        box["t_big"] = run.timeout(60.0)
        box["t_none"] = run.timeout()

    f()
    rem = box["rem"]
    assert rem.steps == 4 and rem.tool_calls == 7 and rem.tokens is None
    assert rem.seconds == 8.75
    assert box["t_small"] == 2.0
    assert box["t_big"] == 8.25 and box["t_none"] == 8.25  # minus the 0.5 s margin


@pytest.mark.parametrize("freezes", [True, False])
def test_pause_resume_deadline_follows_policy(
    clocked_sink: SpanSink, clock: ManualClock, freezes: bool
) -> None:
    box: dict = {}

    @guard.run(agent="a", deadline_s=0.375, pause_freezes_deadline=freezes)
    def f() -> str:
        run = guard.current_run()
        clock.advance(0.125)
        run.pause("waiting for approval")
        assert run.paused
        clock.advance(0.5)  # longer than the whole deadline
        box["cancelled_while_paused"] = run.cancelled
        run.resume()
        box["seconds_left"] = run.remaining().seconds
        with guard.step():
            pass
        return "approved"

    if freezes:
        assert f() == "approved"
        assert box == {"cancelled_while_paused": False, "seconds_left": 0.25}
    else:
        with pytest.raises(guard.RunStopped) as info:
            f()
        assert info.value.outcome.reason == "deadline"
        assert box == {"cancelled_while_paused": True, "seconds_left": 0.0}
    assert "approval" not in clocked_sink.dump()  # the pause reason is fingerprinted


def test_a_frozen_deadline_runs_again_after_resume(
    clocked_sink: SpanSink, clock: ManualClock
) -> None:
    @guard.run(agent="a", deadline_s=0.375, pause_freezes_deadline=True)
    def f() -> None:
        run = guard.current_run()
        run.pause("approval")
        clock.advance(5.0)
        run.resume()
        clock.advance(0.25)
        assert not run.cancelled  # 0.25 s of running time: within the deadline
        clock.advance(0.25)
        assert run.cancelled  # the re-armed deadline fired on resume's clock
        with guard.step():
            pass

    with pytest.raises(guard.RunStopped) as info:
        f()
    assert (info.value.outcome.reason, info.value.outcome.deadline_ms) == ("deadline", 375)


def test_pid_tracking_without_group(sink: SpanSink) -> None:
    proc = subprocess.Popen(["sleep", "60"])  # same group as the test: signalled alone

    @guard.run(agent="a")
    def f() -> None:
        guard.current_run().track_process(proc)
        guard.current_run().cancel()

    f_exc = _catch(f)
    assert f_exc is not None
    assert proc.wait(5) != 0
