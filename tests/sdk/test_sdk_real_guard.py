"""The SDK against the real guard server (guard.server.GuardServer on 127.0.0.1:0)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from _sdk_real_guard import guard_in_thread
from _wait import wait_until, wait_until_async

import guard
from guard.testing import capture_spans
from guard.v1 import guard_pb2 as pb
from guard.v1 import guard_pb2_grpc as pb_grpc

pytest.importorskip("guard.server")

POLICY = {
    "runs": {"max_steps": 3},
    "tenants": {"tiny": {"rolling": [{"metric": "runs", "limit": 1, "window_s": 3600}]}},
}


@pytest.fixture
def real_guard() -> Iterator[dict[str, Any]]:
    with guard_in_thread(POLICY) as box:
        yield box


def _wait_runs(sink: Any, n: int) -> list[Any]:
    wait_until(lambda: len(sink.runs) >= n, 10, f"{n} run records")
    return list(sink.runs)


def test_admit_deny_and_records_through_the_real_guard(real_guard: dict[str, Any]) -> None:
    # The guard's Admit carries the policy's tighter limits; a loaded CI machine may take
    # longer than the default 200 ms to answer, and the run would then go on fail-open.
    address = f"127.0.0.1:{real_guard['port']}"
    with capture_spans(endpoint=address, tenant="acme", admit_timeout_ms=10_000):

        @guard.run(agent="bot", max_steps=10)  # the guard's policy tightens this to 3
        def loop() -> None:
            while True:
                with guard.step() as step:
                    step.model_call(model="gpt-4.1", input_tokens=10, output_tokens=1)

        with pytest.raises(guard.RunStopped) as info:
            loop()
        assert (info.value.outcome.reason, info.value.outcome.steps) == ("max_steps", 3)

        @guard.run(agent="bot", tenant="tiny")
        def small() -> str:
            return "ran"

        assert small() == "ran"
        with pytest.raises(guard.RunStopped) as denied:
            small()  # the tenant's one run per hour is used up
        o = denied.value.outcome
        assert (o.status, o.reason, o.decided_by) == ("terminated", "tenant_budget", "guard")
        guard.shutdown()
    runs = _wait_runs(real_guard["sink"], 3)
    assert [(r.reason.value, r.decided_by.value) for r in runs] == [
        ("max_steps", "sdk"),
        ("final_answer", "sdk"),
        ("tenant_budget", "guard"),
    ]


async def test_operator_cancel_through_guard_admin(real_guard: dict[str, Any]) -> None:
    port = real_guard["port"]
    with capture_spans(endpoint=f"127.0.0.1:{port}", tenant="acme"):
        box: dict[str, Any] = {}

        @guard.run(agent="sleepy")
        async def f() -> None:
            box["run"] = guard.current_run()
            async with guard.step():
                await asyncio.sleep(60)

        task = asyncio.ensure_future(f())
        run_id = (await wait_until_async(lambda: box.get("run"), 10, "the run to start")).run_id

        def listed() -> bool:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                runs = pb_grpc.GuardAdminStub(ch).ListRuns(pb.ListRunsRequest()).runs
            return any(r.run_id == run_id and r.connected for r in runs)

        # registered with the guard over the control stream (not a sleep)
        await wait_until_async(lambda: asyncio.to_thread(listed), 10, "the run listed")

        def admin_cancel() -> Any:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                sel = pb.Selector(run_id=run_id)
                return pb_grpc.GuardAdminStub(ch).Cancel(
                    pb.CancelRequest(selector=sel, reason="user left")
                )

        resp = await asyncio.to_thread(admin_cancel)
        assert list(resp.run_ids) == [run_id]
        # the step awaits a 60 s sleep: ending within a much shorter bound is the interrupt
        with pytest.raises(guard.RunStopped) as info:
            await asyncio.wait_for(task, 10)
        o = info.value.outcome
        assert (o.status, o.reason, o.decided_by) == ("cancelled", "operator_cancel", "operator")
