"""Tenant rolling budgets and concurrency across agent streams; admin surfaces and the CLI."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from _wait import wait_until_async

from guard.cli._client import AdminClient
from guard.policy import DecidedBy, Reason
from guard.server import GuardServer, MemorySink, ServerThread

from .conftest import Agent, config, model_span, trace_id_of

TENANTS = {
    "acme": {
        "max_concurrent_runs": 3,
        "rolling": [{"metric": "cost_usd", "limit": 1.0, "window_s": 3600}],
    }
}


async def test_shared_rolling_cost_cancels_all_processes_and_denies_new(sink):
    async with GuardServer(config(tenants=TENANTS), listen="127.0.0.1:0", sink=sink) as srv:
        a, b = Agent(srv.address), Agent(srv.address)
        await a.connect(process_id="A")
        await b.connect(process_id="B")
        await a.start_run("a1", trace_id_of(1))
        await b.start_run("b1", trace_id_of(2))
        await a.export(model_span("a1", trace_id_of(1), **{"guard.cost.usd": 0.6}))
        assert not a.directives("cancel")
        await b.export(model_span("b1", trace_id_of(2), **{"guard.cost.usd": 0.5}))
        ca = await a.wait_for(lambda m: m.WhichOneof("body") == "cancel")
        cb = await b.wait_for(lambda m: m.WhichOneof("body") == "cancel")
        assert ca.cancel.reason == cb.cancel.reason == "tenant_budget"
        third = await a.start_run("a2", trace_id_of(3))
        assert third.WhichOneof("body") == "deny" and third.deny.reason == "tenant_budget"
        # other tenants are not affected
        other = await a.start_run("z1", trace_id_of(4), tenant="globex")
        assert other.WhichOneof("body") == "admit"
        with AdminClient(srv.address) as c:
            budgets = await asyncio.to_thread(c.tenant_budgets, "acme")
        acme = budgets.tenants[0]
        assert acme.exhausted and acme.windows[0].used >= 1.0
        await wait_until_async(lambda: sum(d.action == "cancel" for d in sink.decisions) == 2)
        assert {d.reason for d in sink.decisions if d.action == "deny"} == {"tenant_budget"}
        await a.close()
        await b.close()


async def test_concurrency_cap_and_slot_release(sink):
    async with GuardServer(config(tenants=TENANTS), listen="127.0.0.1:0", sink=sink) as srv:
        a = Agent(srv.address)
        await a.connect()
        kinds = [
            (await a.start_run(f"r{i}", trace_id_of(10 + i))).WhichOneof("body") for i in range(4)
        ]
        assert kinds == ["admit", "admit", "admit", "deny"]
        await a.end_run("r0")
        await wait_until_async(lambda: "r0" not in srv.registry.runs)
        assert (await a.start_run("r9", trace_id_of(30))).WhichOneof("body") == "admit"
        await a.close()


def test_cli_cancel_and_runs_against_a_threaded_guard():
    sink = MemorySink()
    with ServerThread(config(), sink=sink) as srv:

        async def scenario() -> list[str]:
            a, g = Agent(srv.address, tenant="acme"), Agent(srv.address, tenant="globex")
            await a.connect(process_id="A")
            await g.connect(process_id="G")
            await a.start_run("a1", trace_id_of(1))
            await a.start_run("a2", trace_id_of(2), agent="other")
            await g.start_run("g1", trace_id_of(3))
            base = [sys.executable, "-m", "guard.cli"]
            ep = ["--endpoint", srv.address, "--json"]
            runs = await asyncio.to_thread(
                subprocess.run, [*base, "runs", *ep], capture_output=True, text=True, check=True
            )
            listed = json.loads(runs.stdout)
            assert listed["total"] == 3
            out = await asyncio.to_thread(
                subprocess.run,
                [*base, "cancel", "--tenant", "acme", "--reason", "drill", *ep],
                capture_output=True,
                text=True,
                check=True,
            )
            cancelled = json.loads(out.stdout)["cancelled"]
            await a.wait_for(lambda m: m.WhichOneof("body") == "cancel" and m.cancel.run_id == "a2")
            assert not g.directives("cancel")
            assert {d.reason for d in a.directives("cancel")} == {"operator_cancel"}
            await a.close()
            await g.close()
            return cancelled

        assert sorted(asyncio.run(scenario())) == ["a1", "a2"]
        records = [d for d in sink.decisions if d.action == "cancel"]
        assert {r.decided_by for r in records} == {DecidedBy.OPERATOR.value}
        assert {r.reason for r in records} == {Reason.OPERATOR_CANCEL.value}
