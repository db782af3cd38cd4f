"""The control-stream client against a real in-test GuardControl servicer."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import pytest
from _sdk_fake_guard import FakeGuard
from _wait import wait_until, wait_until_async

import guard
from guard.errors import GuardUnavailable
from guard.policy import Limits
from guard.testing import capture_spans
from guard.v1 import guard_pb2 as pb
from guard.wire import limits_to_pb


@pytest.fixture
def fake():
    g = FakeGuard()
    yield g
    g.stop()


def _settings(g: FakeGuard, **kw):
    base = dict(
        endpoint=g.endpoint,
        token="tenant-token",
        tenant="acme",
        admit_timeout_ms=2000,
        reconnect_min_s=0.05,
        reconnect_max_s=0.2,
        heartbeat_interval_ms=100,
    )
    base.update(kw)
    return base


def test_admit_tightens_limits_and_run_ended_is_reported(fake: FakeGuard) -> None:
    fake.decide = lambda rs: pb.GuardMessage(
        admit=pb.Admit(
            run_id=rs.run_id,
            request_id=rs.request_id,
            effective=limits_to_pb(Limits(max_steps=2)),
            price_book_version="guard-prices-1",
        )
    )
    with capture_spans(**_settings(fake)):

        @guard.run(agent="bot", max_steps=10)
        def f() -> None:
            while True:
                with guard.step():
                    pass

        with pytest.raises(guard.RunStopped) as info:
            f()
        o = info.value.outcome
        assert (o.reason, o.steps, o.price_book_version) == ("max_steps", 2, "guard-prices-1")
        ended = fake.wait(lambda m: m.WhichOneof("body") == "run_ended")
        assert ended is not None and ended.run_ended.outcome.run_id == o.run_id
        assert ended.run_ended.outcome.reason == "max_steps"
        assert ended.run_ended.outcome.decided_by == "sdk"
    first = fake.received[0]
    assert first.WhichOneof("body") == "hello" and first.hello.tenant == "acme"
    rs = fake.of("run_started")[0]
    assert rs.requested.max_steps == 10 and rs.agent == "bot" and len(rs.trace_id) == 32
    assert fake.metadata[0]["authorization"] == "Bearer tenant-token"
    # the Hello says the agent takes batches and does not ack an Admit (nothing waits on it)
    assert first.hello.accepts_batches and not fake.of("ack")


def test_deny_raises_before_the_first_step(fake: FakeGuard) -> None:
    fake.decide = lambda rs: pb.GuardMessage(
        deny=pb.Directive(
            run_id=rs.run_id,
            request_id=rs.request_id,
            reason="tenant_budget",
            detail="cost_usd 5.01 of 5.00 in 3600s",
        )
    )
    ran = []
    with capture_spans(**_settings(fake)):

        @guard.run(agent="bot")
        def f() -> None:
            ran.append(True)

        with pytest.raises(guard.RunStopped) as info:
            f()
    o = info.value.outcome
    assert (o.status, o.reason, o.decided_by, o.steps) == (
        "terminated",
        "tenant_budget",
        "guard",
        0,
    )
    assert ran == [] and "5.01" in o.message


async def test_guard_cancel_interrupts_an_awaiting_run_and_is_acked(fake: FakeGuard) -> None:
    with capture_spans(**_settings(fake)):
        box: dict = {}

        @guard.run(agent="bot")
        async def f() -> None:
            box["run"] = guard.current_run()
            async with guard.step():
                await asyncio.sleep(60)

        task = asyncio.ensure_future(f())
        run_id = (await wait_until_async(lambda: box.get("run"), 10, "the run to start")).run_id
        cid = fake.send(
            cancel=pb.Directive(run_id=run_id, reason="loop_detected", detail="exact_repeat 3x")
        )
        # the step awaits a 60 s sleep: ending within a much shorter bound is the interrupt
        # (the latency itself is benchmarks/bench_cancel_latency.py's figure)
        with pytest.raises(guard.RunStopped) as info:
            await asyncio.wait_for(task, 10)
        o = info.value.outcome
        assert (o.status, o.reason, o.decided_by) == ("terminated", "loop_detected", "guard")
        ack = await asyncio.to_thread(
            fake.wait, lambda m: m.WhichOneof("body") == "ack" and m.ack.command_id == cid
        )
        assert ack is not None and ack.ack.applied and ack.ack.run_id == run_id


def test_operator_cancel_warn_and_wrap_up(fake: FakeGuard) -> None:
    with capture_spans(**_settings(fake)) as spans:
        box: dict = {}
        seen: list = []
        go = threading.Event()

        @guard.run(agent="bot")
        def f() -> None:
            run = guard.current_run()
            run.on_directive(lambda action, reason, detail: seen.append((action, reason)))
            box["run"] = run
            go.wait(5)
            for _ in range(200):
                with guard.step():
                    time.sleep(0.01)

        th = threading.Thread(target=lambda: box.setdefault("exc", _catch(f)))
        th.start()
        rid = wait_until(lambda: box.get("run"), 10, "the run to start").run_id
        fake.send(warn=pb.Directive(run_id=rid, reason="cost_budget", utilisation=0.72))
        fake.send(wrap_up=pb.Directive(run_id=rid, reason="cost_budget", utilisation=0.91))
        wait_until(lambda: box["run"].wrap_up_requested, 10, "the wrap_up applied")
        assert box["run"].warned
        go.set()
        fake.send(cancel=pb.Directive(run_id=rid, reason="operator_cancel", detail="fleet stop"))
        th.join(10)
        o = box["exc"].outcome
        assert (o.status, o.reason, o.decided_by) == ("cancelled", "operator_cancel", "operator")
        assert seen == [("warn", "cost_budget"), ("wrap_up", "cost_budget")]
        events = [e.name for e in spans.named("invoke_agent")[0].events]
        assert "guard.warn" in events and "guard.wrap_up" in events
    unknown = [a for a in fake.of("ack") if not a.applied]
    assert unknown == []


def _within(timeout_s: float, fn):
    """``fn()`` in a thread, its result awaited for at most ``timeout_s`` (else a failure)."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(fn).result(timeout=timeout_s)
    finally:
        pool.shutdown(wait=False)  # a hung call fails the test now, not at the suite's timeout


def _catch(fn):
    try:
        fn()
    except guard.RunStopped as exc:
        return exc
    return None


def test_reconnect_resends_live_runs_and_heartbeats(fake: FakeGuard) -> None:
    with capture_spans(**_settings(fake)):
        box: dict = {}
        release = threading.Event()

        @guard.run(agent="bot")
        def f() -> str:
            box["run"] = guard.current_run()
            with guard.step():
                pass
            release.wait(10)
            return "done"

        th = threading.Thread(target=lambda: box.setdefault("value", f()))
        th.start()
        rid = wait_until(lambda: box.get("run"), 10, "the run to start").run_id
        beat = fake.wait(
            lambda m: (
                m.WhichOneof("body") == "heartbeat"
                and any(r.run_id == rid and r.usage.steps == 1 for r in m.heartbeat.runs)
            )
        )
        assert beat is not None
        fake.drop_stream()
        hello2 = fake.wait(
            lambda m: (
                m.WhichOneof("body") == "hello"
                and any(r.run_id == rid and r.usage.steps == 1 for r in m.hello.live_runs)
            )
        )
        assert hello2 is not None
        live = next(r for r in hello2.hello.live_runs if r.run_id == rid)
        assert live.usage.steps == 1
        release.set()
        th.join(5)
        assert box["value"] == "done"
        ended = fake.wait(
            lambda m: m.WhichOneof("body") == "run_ended" and m.run_ended.outcome.run_id == rid
        )
        assert ended is not None and ended.run_ended.outcome.status == "completed"
    assert len([m for m in fake.received if m.WhichOneof("body") == "hello"]) >= 2


def test_unanswered_admission_waits_at_most_the_timeout(fake: FakeGuard) -> None:
    fake.decide = lambda rs: None  # the guard never answers
    with capture_spans(**_settings(fake, admit_timeout_ms=100)):

        @guard.run(agent="bot")
        def warm() -> None:
            pass

        warm()  # the stream is up now

        @guard.run(agent="bot")
        def f() -> str:
            return "ran under local limits"

        # unanswered, on an open stream: only the timeout ends the wait, within a bound (how
        # long it waits is benchmarks/bench_sdk_waits.py's admission_unanswered)
        assert _within(10, f) == "ran under local limits"
        rid = fake.of("run_started")[-1].run_id
        ended = fake.wait(
            lambda m: m.WhichOneof("body") == "run_ended" and m.run_ended.outcome.run_id == rid
        )
        assert ended is not None and ended.run_ended.outcome.status == "completed"


def test_unreachable_guard_fails_open_and_fail_closed_refuses() -> None:
    from guard.sdk._runtime import get_runtime

    @guard.run(agent="bot")
    def f() -> str:
        return "ok"

    # Known-down guard: no admission wait at all. A wait would end only at the admit timeout
    # (60 s) or at the next connect attempt's failure (15-30 s away), both far past the
    # bounded wait below: returning within it is the proof, with no clock read (the wait in
    # ms: benchmarks/bench_sdk_waits.py's admission_known_down).
    with capture_spans(
        endpoint="127.0.0.1:9",
        admit_timeout_ms=60_000,
        reconnect_min_s=30,
        reconnect_max_s=30,
        export_timeout_s=0.2,
        shutdown_ack_timeout_s=0.1,  # the RunEnded records have nowhere to go: do not wait
    ):
        assert _within(10, f) == "ok"  # the first attempt fails: the waiting run goes on
        rt = get_runtime()
        assert rt.control is not None and rt.control.first_attempt_done.wait(5)
        assert _within(10, f) == "ok"
    with capture_spans(
        endpoint="127.0.0.1:9",
        admit_timeout_ms=100,
        reconnect_min_s=0.05,
        export_timeout_s=0.2,
        shutdown_ack_timeout_s=0.1,
    ):

        @guard.run(agent="bot", fail_closed=True)
        def strict() -> str:
            return "should not run"

        with pytest.raises(GuardUnavailable, match="fail_closed") as info:
            strict()
        assert info.value.outcome.status == "failed"


def test_shutdown_right_after_a_run_still_delivers_run_ended(fake: FakeGuard) -> None:
    guard.configure(**_settings(fake))

    @guard.run(agent="bot")
    def f() -> str:
        return "ok"

    for _ in range(20):
        assert f() == "ok"
    counters = guard.stats()
    assert counters["control_connected"] == 1
    guard.shutdown()  # as an application does at exit
    ended = fake.of("run_ended")
    assert len(ended) == 20 and all(e.outcome.status == "completed" for e in ended)


def test_nothing_raw_crosses_the_wire(fake: FakeGuard) -> None:
    canaries = ["CANARY-ARG-31f0", "CANARY-RES-77aa", "CANARY-FACT-0c0c", "CANARY-EXC-9d9d"]
    guard.configure(**_settings(fake, hmac_key=b"wire-key-0123456789"))

    @guard.tool
    def lookup(q: str) -> str:
        return "CANARY-RES-77aa"

    @guard.tool
    def broken(q: str) -> str:
        raise RuntimeError("CANARY-EXC-9d9d " + q)

    @guard.run(agent="bot", max_steps=5)
    def f() -> None:
        with guard.step() as step:
            lookup("CANARY-ARG-31f0")
            step.progress(facts=["CANARY-FACT-0c0c"])
        with guard.step():
            broken("CANARY-ARG-31f0")

    with pytest.raises(RuntimeError):
        f()
    assert guard.flush(5)
    guard.shutdown()
    wire = b"".join(fake.traces.raw) + b"".join(m.SerializeToString() for m in fake.received)
    assert b"execute_tool lookup" in wire and b"guard.result.hash" in wire
    assert fake.of("run_ended")[0].outcome.reason == "tool_error"
    for canary in canaries:
        assert canary.encode() not in wire


def test_shutdown_delivers_the_last_run_ended_to_a_slow_guard() -> None:
    """A guard that reads behind (CPU load) still gets the RunEnded written just before
    shutdown: the SDK half-closes and waits for the guard to end the stream instead of
    cancelling it while the last write is unread."""
    slow = FakeGuard(read_delay_s=0.1, heartbeat_interval_ms=60_000)
    try:
        guard.configure(**_settings(slow))

        @guard.run(agent="bot")
        def f() -> str:
            with guard.step():
                pass
            return "done"

        assert f() == "done"
        guard.shutdown()  # at once: the guard has not read the RunEnded yet
        ended = slow.wait(lambda m: m.WhichOneof("body") == "run_ended", timeout=5.0)
        assert ended is not None and ended.run_ended.outcome.reason == "final_answer"
        with slow.cond:
            slow.cond.wait_for(lambda: slow.stream_ends, timeout=5.0)
        assert slow.stream_ends == ["agent"]  # ended by the agent's half-close, not a cancel
    finally:
        slow.stop()


def test_admit_loop_settings_are_adopted_tightest_wins(fake: FakeGuard) -> None:
    """The effective limits are the tightest of the decorator and the guard's Admit: loop
    detection included (window, repeat threshold, stagnation), not only the budgets."""
    from guard.policy import LoopSettings

    admitted = Limits(loop=LoopSettings(window=8, repeat_threshold=2, no_progress_steps=30))
    fake.decide = lambda rs: pb.GuardMessage(
        admit=pb.Admit(run_id=rs.run_id, request_id=rs.request_id, effective=limits_to_pb(admitted))
    )
    seen = {}
    with capture_spans(**_settings(fake)):

        @guard.run(agent="bot", loop={"window": 20, "repeat_threshold": 10, "no_progress_steps": 5})
        def f() -> None:
            loop = guard.current_run().limits.loop
            seen["loop"] = (loop.window, loop.repeat_threshold, loop.no_progress_steps)
            for _ in range(5):
                with guard.step() as step:
                    step.tool_call("search", {"q": "refund"}, result="nothing")

        with pytest.raises(guard.RunStopped) as info:
            f()
    assert seen["loop"] == (8, 2, 5)  # each the tighter of the two
    o = info.value.outcome
    # The guard's repeat_threshold (2), not the decorator's (10), stopped it locally.
    assert (o.reason, o.decided_by, o.tool_calls) == ("loop_detected", "sdk", 2)
