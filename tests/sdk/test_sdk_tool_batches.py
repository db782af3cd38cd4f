"""``run_tools`` / ``admit_tools`` over any callable: every executed call is counted and
fingerprinted once; paid tools reserve their price before they run."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

import guard
from guard.sdk._run import current_run_or_none


@dataclass
class Call:  # an SDK-style tool-call object (attributes, not a dict)
    id: str
    name: str
    arguments: str = "{}"
    extra: dict[str, Any] = field(default_factory=dict)


def _calls(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {"id": f"c{i}", "name": "lookup", "args": {"order": i}} for i in range(start, start + n)
    ]


def test_run_tools_over_a_plain_coroutine_counts_and_fingerprints_every_call(sink) -> None:
    seen = {}

    async def plain(call: dict[str, Any]) -> str:  # not a @guard.tool, records nothing
        await asyncio.sleep(0)
        return f"order {call['args']['order']}"

    @guard.run(agent="tools", max_steps=100)
    async def agent() -> None:
        for b in range(10):
            async with guard.step():
                results = await guard.run_tools(_calls(8, 8 * b), plain)
            assert results == [f"order {i}" for i in range(8 * b, 8 * b + 8)]
        seen["usage"] = guard.current_run().usage()

    asyncio.run(agent())
    assert seen["usage"].tool_calls == 80
    spans = sink.named("execute_tool")
    assert len(spans) == 80 and {s.name for s in spans} == {"execute_tool lookup"}
    fps = {s.attributes["guard.action.fingerprint"] for s in spans}
    assert len(fps) == 80  # distinct arguments, distinct prints: the arguments were read
    assert all("guard.result.hash" in s.attributes for s in spans)
    assert {s.attributes.get("gen_ai.tool.call.id") for s in spans} == {f"c{i}" for i in range(80)}


def test_plain_calls_are_loop_checked_and_objects_with_json_arguments_work(sink) -> None:
    def same(call: Call) -> str:  # a plain sync function
        return "no results"

    @guard.run(agent="looper", max_steps=100, loop={"repeat_threshold": 3})
    async def agent() -> None:
        while True:
            async with guard.step():
                await guard.run_tools([Call("x", "search", '{"q": "refund",  "page": 1}')], same)

    with pytest.raises(guard.RunStopped) as stop:
        asyncio.run(agent())
    assert stop.value.outcome.reason == "loop_detected"
    assert stop.value.outcome.tool_calls == 3


def test_a_guard_tool_or_step_tool_call_inside_run_tools_is_counted_once(sink) -> None:
    seen = {}

    @guard.tool
    async def lookup(order: int) -> str:
        return f"order {order}"

    @guard.run(agent="tools", max_steps=100)
    async def agent() -> None:
        run = current_run_or_none()
        async with guard.step():
            await guard.run_tools(_calls(8), lambda c: lookup(c["args"]["order"]))
        seen["decorated"] = run.budget.usage().tool_calls
        async with guard.step() as step:

            async def by_hand(c: dict[str, Any]) -> str:
                step.tool_call("lookup", c["args"], result=c["id"])
                return "x"

            await guard.run_tools(_calls(8, 100), by_hand)
        seen["by_hand"] = run.budget.usage().tool_calls
        async with guard.step():  # one batch, both kinds: each call counted once

            async def mixed(c: dict[str, Any]) -> str:
                order = c["args"]["order"]
                return await lookup(order) if order % 2 else f"plain {order}"

            await guard.run_tools(_calls(8, 200), mixed)
        seen["mixed"] = run.budget.usage().tool_calls

    asyncio.run(agent())
    assert seen == {"decorated": 8, "by_hand": 16, "mixed": 24}
    assert len(sink.named("execute_tool")) == 24


def test_admit_tools_complete_records_the_calls_a_plain_function_ran(sink) -> None:
    seen = {}

    @guard.run(agent="tools", max_tool_calls=5)
    def agent() -> None:
        run = current_run_or_none()
        with guard.step() as step:
            batch = guard.admit_tools(_calls(8))
            assert len(batch.admitted) == 5 and len(batch.rejected) == 3
            step.tool_call("lookup", {"order": 0}, result="order 0")  # one recorded by hand
            results = batch.complete([f"order {c['args']['order']}" for c in batch.admitted])
        seen["usage"] = run.budget.usage()
        seen["results"] = results

    agent()  # the quota is reached by the batch; the run completes (completion wins)
    assert seen["usage"].tool_calls == 5
    assert seen["results"][5]["is_error"] and "max_tool_calls" in seen["results"][5]["content"]
    assert len(sink.named("execute_tool")) == 5


def test_paid_tools_in_batches_of_eight_never_pass_the_cost_limit(sink) -> None:
    seen = {"ran": 0}

    @guard.run(agent="paid", max_cost_usd=0.10, max_steps=100)
    def agent() -> None:
        run = current_run_or_none()
        for b in range(5):
            with guard.step() as step, guard.admit_tools(_calls(8, 8 * b), cost_usd=0.01) as batch:
                for c in batch.admitted:
                    seen["ran"] += 1
                    step.tool_call("lookup", c["args"], result=c["id"], cost_usd=0.01)
            if batch.rejected:
                seen["rejection"] = batch.rejection(batch.rejected[0])
                break
        seen["cost"] = run.budget.usage().cost_usd

    agent()
    assert seen["ran"] == 10 and seen["cost"] == pytest.approx(0.10)
    assert "max_cost_usd reached" in seen["rejection"]["content"], seen["rejection"]


def test_a_paid_guard_tool_reserves_its_price_before_it_runs(sink) -> None:
    ran = []

    @guard.tool(cost_usd=0.03)
    async def paid(order: int) -> str:
        ran.append(order)
        await asyncio.sleep(0)
        return "ok"

    @guard.run(agent="paid", max_cost_usd=0.10, max_steps=100)
    async def agent() -> list[Any]:
        async with guard.step():
            return await asyncio.gather(*(paid(i) for i in range(8)), return_exceptions=True)

    results = asyncio.run(agent())
    stops = [r for r in results if isinstance(r, guard.RunStopped)]
    assert len(ran) == 3 and results.count("ok") == 3 and len(stops) == 5
    assert stops[0].outcome.reason == "cost_budget" and "cost_usd=0.03" in stops[0].outcome.message


def test_a_batch_no_call_of_which_fits_the_cost_budget_stops_the_run(sink) -> None:
    seen = {"ran": 0, "batches": 0}

    @guard.run(agent="paid", max_cost_usd=0.10, max_steps=1000)
    def agent() -> None:
        for b in range(1000):
            with guard.step() as step, guard.admit_tools(_calls(8, 8 * b), cost_usd=0.01) as batch:
                seen["batches"] += 1
                for c in batch.admitted:
                    seen["ran"] += 1
                    step.tool_call("lookup", c["args"], result=c["id"], cost_usd=0.01)

    with pytest.raises(guard.RunStopped) as stop:
        agent()
    out = stop.value.outcome
    assert out.reason == "cost_budget", out
    assert "no call of a batch of 8 fits" in out.message and "cost_usd" in out.message
    assert seen["ran"] == 10 and out.tool_calls == 10
    assert seen["batches"] == 2  # 8, then 2 of 8; the third batch is refused whole
