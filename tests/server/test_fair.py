"""Per-tenant turns: one tenant's concurrent sliced requests take turns, so another tenant's
work waits behind at most one of their slices, not one per request in flight."""

from __future__ import annotations

import asyncio

from guard.server.runtime._fair import TenantTurns


async def _sliced(turns: TenantTurns | None, tenant: str, name: str, log: list[str]) -> None:
    async def body() -> None:
        for i in range(3):
            log.append(f"{name}{i}")
            await asyncio.sleep(0)

    if turns is None:
        await body()
    else:
        async with turns.turn(tenant):
            await body()


async def _b(log: list[str]) -> None:
    log.append("B")


async def _order(turns: TenantTurns | None) -> list[str]:
    log: list[str] = []
    tasks = [asyncio.ensure_future(_sliced(turns, "a", n, log)) for n in ("x", "y", "z")]
    await asyncio.sleep(0)  # A's three requests are in flight: each ran its first slice
    tasks.append(asyncio.ensure_future(_b(log)))
    await asyncio.gather(*tasks)
    return log


async def test_a_tenants_sliced_requests_take_turns_and_others_wait_one_slice():
    without = await _order(None)
    # Without turns every in-flight request of A runs a slice before B: x0 y0 z0 x1 y1 z1 B
    assert without.index("B") == 6
    with_turns = await _order(TenantTurns())
    # With turns A's requests run one after the other, and B waits behind one slice of A.
    assert [e for e in with_turns if e != "B"] == [
        "x0",
        "x1",
        "x2",
        "y0",
        "y1",
        "y2",
        "z0",
        "z1",
        "z2",
    ]
    assert with_turns.index("B") <= 2


async def test_turns_are_per_tenant_and_the_map_is_bounded():
    turns = TenantTurns(cap=2)
    a = turns.turn("a")
    assert turns.turn("a") is a and turns.turn("b") is not a
    async with a:
        turns.turn("c")  # at the cap: an unlocked lock (b) goes, the held one (a) stays
        assert turns.turn("a") is a
    assert len(turns._locks) <= 2
