"""One contract for each shared-state part, run over its in-memory and its Redis implementation.

A guard process builds its tenant budgets, run directory and directive bus from
``local_parts``; a replica (``serve --redis``) from ``redis_parts`` on a real redis-server.
The callers only see the interfaces, so both must answer the same way: admission against the
concurrency cap, a slot given back, usage into the rolling windows, the exhausted window and
its numbers, the status message, and the directory's and bus's answers for a run nobody holds.
A Redis implementation settles with the fleet in ``sync()``, which the contract awaits where
the interface says a verdict may come from it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from guard.policy import Action, PolicyConfig, Reason, Usage
from guard.server import MemorySink
from guard.server._parts import local_parts, parts_for
from guard.server.runs._registry import Registry

POLICY = {
    # a loaded machine can take longer than the default to connect to a live Redis
    "guard": {"redis_timeout_ms": 2000.0},
    "tenants": {
        "acme": {
            "max_concurrent_runs": 2,
            "rolling": [{"metric": "cost_usd", "limit": 1.0, "window_s": 3600}],
        },
        "quiet": {"max_concurrent_runs": 5},
    },
}


@pytest.fixture(params=["memory", "redis"])
async def registry(request: pytest.FixtureRequest) -> AsyncIterator[Registry]:
    config = PolicyConfig.from_dict(POLICY)
    if request.param == "memory":
        factory = local_parts
    else:
        factory = parts_for(config, redis_url=request.getfixturevalue("redis_url"), guard_id="r1")
    reg = Registry(config, MemorySink(), guard_id="r1", parts=factory)
    await reg.parts.start()
    try:
        yield reg
    finally:
        await reg.parts.close()


async def _admit(reg: Registry, tenant: str, run_id: str) -> Any:
    """The verdict on one admission: at once, or from the fleet once settled."""
    verdicts: list[Any] = []
    reg.budgets.admit(tenant, run_id, verdicts.append)
    if not verdicts and reg.budgets.settles:
        await reg.budgets.sync()
    assert len(verdicts) == 1, verdicts
    return verdicts[0]


async def test_admission_holds_the_concurrency_cap_and_an_end_gives_the_slot_back(registry):
    b = registry.budgets
    assert not (await _admit(registry, "acme", "a1")).stop
    assert not (await _admit(registry, "acme", "a2")).stop
    third = await _admit(registry, "acme", "a3")
    assert third.stop and third.reason is Reason.TENANT_BUDGET, third
    assert "2" in third.message  # the cap is in the message
    b.run_ended("acme", "a1")
    if b.settles:
        await b.sync()
    assert not (await _admit(registry, "acme", "a4")).stop


async def test_usage_fills_a_window_and_the_part_says_which_and_by_how_much(registry):
    b = registry.budgets
    assert b.wants_usage("acme") and not b.wants_usage("quiet")
    assert b.budget("acme") is not None
    first = b.record("acme", Usage(cost_usd=0.6))
    assert first.action is Action.CONTINUE
    if b.settles:
        await b.sync()
    assert b.exhausted("acme") is None
    over = b.record("acme", Usage(cost_usd=0.5))
    if b.settles:
        await b.sync()
    assert over.stop or b.exhausted("acme") is not None
    metric, used, limit = b.exhausted("acme")
    assert (metric, limit) == ("cost_usd", 1.0) and used == pytest.approx(1.1)
    status = b.status("acme")
    assert status.tenant == "acme" and status.exhausted
    assert (await b.fleet_status("acme")).exhausted
    assert {"acme", "quiet"} <= set(b.known())


async def test_a_new_tenant_has_an_empty_budget_and_tenants_do_not_share_windows(registry):
    b = registry.budgets
    b.record("acme", Usage(cost_usd=2.0))
    if b.settles:
        await b.sync()
    assert b.exhausted("acme") is not None
    assert b.exhausted("quiet") is None
    assert not (await _admit(registry, "quiet", "q1")).stop
    assert not b.status("quiet").exhausted


async def test_the_directory_and_the_bus_know_no_holder_for_a_run_nobody_holds(registry):
    assert registry.directory.holder("never-registered") is None
