"""agent_lost across replicas: the run's one record is its agent's real end, whichever
replica heard of its failover last.

Replica x held run r1's stream; the stream drops and the agent re-registers r1 on z. x learns
of the move from the run directory's heartbeat (``RedisDirectory.beat``), and until then keeps
r1 as detached. If x's grace runs out first (Redis slow, x's loop busy, a short grace), x
must not write agent_lost: before the sweep ends a run it asks the directory who holds it now
(``RunDirectory.confirm_lost``) and hands it over to a live holder. A run whose holder died
still gets its agent_lost from x, and so does one while Redis cannot be asked (fail-open).

Here the word of the move is held back deterministically (x's ``_moved``, the heartbeat's
handler, keeps what it is told; a provisional run's lookup is not started), and the grace is
cut to zero only once Redis shows z holding the run, so it runs out before x hears of it.

Real parts: a real redis-server, real ``GuardServer`` replicas (grpc on 127.0.0.1:0) and
hand-rolled agents speaking the real protocol."""

from __future__ import annotations

import asyncio
from typing import Any

from _wait import wait_until_async
from server.conftest import Agent, step_span, trace_id_of

from guard.server.directory._redis import RedisDirectory
from guard.v1 import guard_pb2 as pb

TID = trace_id_of(41)
LONG_GRACE = {"guard": {"agent_grace_s": 600.0}}  # cut to zero by the test when it wants


def _hold_word_of_moves(directory: RedisDirectory) -> list[tuple[str, str]]:
    """Keep what the heartbeat tells ``directory`` about runs another replica took over,
    instead of acting on it (the late notification); returns the list it keeps them in."""
    held: list[tuple[str, str]] = []
    directory._moved = lambda run_id, holder: held.append((run_id, holder))  # type: ignore[method-assign]
    return held


async def _holder_in_redis(fleet: Any, run_id: str) -> str | None:
    state, key = fleet["x"].registry.state, fleet["x"].registry.directory.key(run_id)
    (holder,) = await state.pipeline([("HGET", key, "r")])
    return holder


async def _detached_on_x_then_on_z(fleet: Any) -> tuple[Agent, list[tuple[str, str]]]:
    """r1 admitted on x, its stream dropped, re-registered on z; x has been told so by its
    heartbeat, but holds that word back. Returns z's agent and the held words."""
    x = fleet["x"].registry
    held = _hold_word_of_moves(x.directory)
    first = Agent(fleet["x"].address)
    await first.connect(process_id="p1")
    assert (await first.start_run("r1", TID)).WhichOneof("body") == "admit"
    await first.close()  # x's stream drops: r1 is detached on x
    await wait_until_async(lambda: "r1" in x.detached)
    again = Agent(fleet["z"].address)  # the agent fails over and re-registers r1 on z
    rs = pb.RunStarted(run_id="r1", trace_id=TID.hex(), agent="bot", tenant="acme")
    await again.connect(live_runs=[rs], process_id="p1")

    async def z_holds() -> bool:
        return await _holder_in_redis(fleet, "r1") == "z"

    await wait_until_async(z_holds, 10, "z holding r1 in the directory", interval_s=0.02)
    await wait_until_async(lambda: ("r1", "z") in held, 10, "x's heartbeat seeing z hold r1")
    assert "r1" in x.detached  # the word was held: x still waits for r1's agent
    return again, held


def _records(fleet: Any) -> list[tuple[str, str, str]]:
    return [
        (name, o.run_id, o.reason.value)
        for name, sink in sorted(fleet.sinks.items())
        for o in sink.runs
    ]


async def test_a_grace_shorter_than_the_word_of_a_failover_writes_no_agent_lost(fleet, redis_url):
    await fleet.start(redis_url, "xz", **LONG_GRACE)
    x = fleet["x"].registry
    again, held = await _detached_on_x_then_on_z(fleet)
    x.grace_s = 0.0  # x's grace runs out now, before it hears that z holds r1
    await wait_until_async(lambda: "r1" not in x.detached, 10, "x's sweep to settle r1")
    assert _records(fleet) == []  # no agent_lost from x
    assert x.runs["r1"].remote == "z"  # handed over: guarded here as z's remote run
    assert x.directory.stats["lost_handed_over"] == 1
    await again.end_run("r1", status="completed", reason="final_answer")
    await wait_until_async(lambda: fleet.sinks["z"].run("r1") is not None)
    for run_id, holder in held:  # the late word arrives at last: it changes nothing
        RedisDirectory._moved(x.directory, run_id, holder)
    await wait_until_async(lambda: "r1" not in x.runs, 10, "x to learn r1 ended on z")
    x.sweep()
    assert _records(fleet) == [("z", "r1", "final_answer")]  # the agent's real end, once
    await again.close()


async def test_a_provisional_run_registered_on_another_replica_is_handed_over(fleet, redis_url):
    await fleet.start(redis_url, "xz", **LONG_GRACE)
    x = fleet["x"].registry
    x.directory.watch = lambda run: None  # type: ignore[method-assign] (its lookup: late)
    spans = Agent(fleet["x"].address)  # trace-ID routing sends r2's spans to x
    step = step_span("r2", TID, 1, **{"guard.seq": 1, "guard.tenant": "acme"})
    await spans.export(step)
    await wait_until_async(lambda: x.runs.get("r2") is not None and x.runs["r2"].provisional)
    agent = Agent(fleet["z"].address)  # its stream is on z
    await agent.connect(process_id="p2")
    assert (await agent.start_run("r2", TID)).WhichOneof("body") == "admit"

    async def z_holds() -> bool:
        return await _holder_in_redis(fleet, "r2") == "z"

    await wait_until_async(z_holds, 10, "z holding r2 in the directory", interval_s=0.02)
    x.grace_s = 0.0  # the grace for r2's registration runs out on x

    def settled() -> bool:
        return x.runs.get("r2") is None or not x.runs["r2"].provisional

    await wait_until_async(settled, 10, "x's sweep to settle r2")
    assert _records(fleet) == []  # no agent_lost from x
    assert x.runs["r2"].remote == "z"  # guarded here as z's remote run, its step counted
    assert x.runs["r2"].budget.usage().steps == 1
    await agent.end_run("r2")
    await wait_until_async(lambda: "r2" not in x.runs, 10, "x to learn r2 ended on z")
    assert _records(fleet) == [("z", "r2", "final_answer")]
    await agent.close()
    await spans.close()


async def _moved_to_z_then_z_stops(fleet: Any, url: str, *forget: Any) -> tuple[Any, Any, Agent]:
    """r1 moved from x to z (x not told), then z's heartbeats stop and Redis runs ``forget``
    (what their stopping would lapse). Returns x's and z's registries and z's agent."""
    await fleet.start(url, "xz", **LONG_GRACE)
    x, z = fleet["x"].registry, fleet["z"].registry
    again, _held = await _detached_on_x_then_on_z(fleet)
    z.directory._task.cancel()
    await x.state.pipeline([forget])
    return x, z, again


async def test_a_holder_whose_entry_lapsed_gets_the_run_once_it_writes_it_again(fleet, redis_url):
    # z's entry of r1 lapses (z's renewals stopped for longer than the entry's TTL: a blip)
    x, z, again = await _moved_to_z_then_z_stops(fleet, redis_url, "DEL", "og:run:r1")
    x.directory.lost.lapse_wait_s = 600.0  # x waits for the holder's next heartbeat (2 s)
    asked = x.directory.stats["lookups"]
    x.grace_s = 0.0
    await wait_until_async(lambda: x.directory.stats["lookups"] > asked, 10, "x asking")
    assert _records(fleet) == [] and "r1" in x.detached  # no entry: x waits, ends nothing
    z.directory._task = asyncio.ensure_future(z.directory._run())  # z's heartbeat is back
    await wait_until_async(lambda: "r1" not in x.detached, 10, "x handing r1 over")
    assert _records(fleet) == [] and x.runs["r1"].remote == "z"
    await again.end_run("r1")
    await wait_until_async(lambda: fleet.sinks["z"].run("r1") is not None)
    assert _records(fleet) == [("z", "r1", "final_answer")]
    await again.close()


async def test_a_run_whose_new_holder_died_still_gets_agent_lost_from_the_old(fleet, redis_url):
    # z dies holding r1 (as with SIGKILL): no heartbeat any more, gone from the live replicas
    x, _z, again = await _moved_to_z_then_z_stops(fleet, redis_url, "ZREM", "og:replicas", "z")
    x.grace_s = 0.0
    await wait_until_async(lambda: fleet.sinks["x"].run("r1") is not None, 10, "agent_lost")
    assert _records(fleet) == [("x", "r1", "agent_lost")]
    await again.close()


async def test_a_lost_run_nobody_else_holds_gets_agent_lost_once(fleet, redis_url):
    await fleet.start(redis_url, "xz", **LONG_GRACE)
    x = fleet["x"].registry
    first = Agent(fleet["x"].address)
    await first.connect(process_id="p1")
    assert (await first.start_run("r1", TID)).WhichOneof("body") == "admit"
    await first.close()
    await wait_until_async(lambda: "r1" in x.detached)
    x.grace_s = 0.0
    await wait_until_async(lambda: fleet.sinks["x"].run("r1") is not None, 10, "agent_lost")
    x.sweep()
    assert _records(fleet) == [("x", "r1", "agent_lost")]
    # and nothing is left waiting for the directory's answer (so no later sweep skips r1)
    await wait_until_async(lambda: not getattr(x.lifecycle, "_asking", ()), 10, "answers")


async def test_redis_down_a_lost_run_still_gets_agent_lost_after_the_directorys_ttl(
    fleet, redis_url, redis_server
):
    await fleet.start(redis_url, "xz", **LONG_GRACE)
    x = fleet["x"].registry
    first = Agent(fleet["x"].address)
    await first.connect(process_id="p1")
    assert (await first.start_run("r1", TID)).WhichOneof("body") == "admit"
    await first.close()
    await wait_until_async(lambda: "r1" in x.detached)
    redis_server.stop()  # nobody can be asked who holds r1 now
    x.grace_s = 0.0
    # fail-open: once the question is older than the directory's TTL (5 s), x ends r1 itself
    await wait_until_async(lambda: fleet.sinks["x"].run("r1") is not None, 30, "agent_lost")
    assert _records(fleet) == [("x", "r1", "agent_lost")]
    assert x.directory.stats["lost_unconfirmed"] == 1
