"""``GuardAdmin`` through any replica: a fleet Cancel or ListRuns asks every live replica.

The replica that got the call applies it to the runs whose streams it holds (no Redis
needed for that part) and sends the query to each other live replica's stream (the
directory's ``P:replicas``); each applies it to its own runs (``Registry.fleet_apply``:
the caller's principal travels with it, so tenant isolation is each replica's, exactly as
for one guard) and answers on the caller's stream. The caller waits at most
:data:`FLEET_WAIT_S` for the answers and returns the union, with the replicas that did not
answer (Redis down: only its own runs, and says so). A cancel by selector also denies, on
every replica it reached, matching runs that start while it is carried out
(``Decisions.deny_starts``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Any

from guard.errors import StateUnavailable
from guard.server.runtime._auth import Principal
from guard.server.runtime._status import UnknownRun
from guard.v1 import guard_pb2 as pb
from guard.wire import run_status_from_hex

__all__ = ["FLEET_WAIT_S", "Fleet", "FleetAnswer"]

log = logging.getLogger("guard.server")

FLEET_WAIT_S = 1.0


class FleetAnswer:
    """What the replicas answered: the replies, and who did not answer (or why not)."""

    def __init__(self, replies: list[dict[str, Any]], missing: list[str]) -> None:
        self.replies = replies
        self.missing = missing


class Fleet:
    """The fleet half of ``GuardAdmin`` on one replica (see the module docstring)."""

    def __init__(self, registry: Any, directory: Any, bus: Any) -> None:
        self._registry = registry
        self._directory = directory
        self._bus = bus

    async def cancel(
        self, target: str, value: Any, detail: str, principal: Principal
    ) -> tuple[list[str], list[str]]:
        """(the ids cancelled fleet-wide, the replicas that did not answer)."""
        reg = self._registry
        query = {"op": "cancel", "target": target, "value": value, "detail": detail}
        query.update(tenant=principal.tenant, admin=principal.admin)
        try:
            ids = reg.cancel(target, value, detail, principal)  # permission errors raise here
        except UnknownRun:
            ids = []  # not held here: maybe by another replica
        if target != "run_id":
            reg.deny_starts(target, value, principal, detail)
        answer = await self.ask(query)
        seen = set(ids)
        for reply in answer.replies:
            for rid in reply.get("ids", ()):
                if rid not in seen:
                    seen.add(rid)
                    ids.append(rid)
        return ids, answer.missing

    async def list_runs(
        self, tenant: str, agent: str, limit: int
    ) -> tuple[list[pb.RunStatus], int, list[str]]:
        """(the fleet's run statuses, at most ``limit``: this replica's, then each other's,
        each oldest first; their total; the replicas that did not answer)."""
        from guard.server.admin._admin import local_statuses

        statuses, total = local_statuses(self._registry, tenant, agent, limit)
        query = {"op": "list", "scope": tenant, "agent": agent, "limit": limit}
        answer = await self.ask(query)
        for reply in answer.replies:
            total += int(reply.get("total", 0))
            statuses.extend(run_status_from_hex(s) for s in reply["runs"])
        return statuses[:limit], total, answer.missing

    async def ask(self, query: dict[str, Any]) -> FleetAnswer:
        """Send ``query`` to every other live replica; their answers within FLEET_WAIT_S."""
        me = self._bus.guard_id
        try:
            others = [r for r in await self._directory.replicas() if r != me]
        except StateUnavailable as exc:
            log.warning("guard: fleet query answered by this replica only: %s", exc)
            return FleetAnswer([], [f"redis unavailable ({exc})"])
        if not others:
            return FleetAnswer([], [])
        replies: dict[str, dict[str, Any]] = {}
        done = asyncio.Event()

        def on_answer(body: dict[str, Any]) -> None:
            if body.get("from") in others:
                replies[body["from"]] = body
                if len(replies) == len(others):
                    done.set()

        qid = uuid.uuid4().hex
        self._bus.expect(qid, on_answer)
        for replica in others:
            self._bus.send(replica, "q", {**query, "id": qid})
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), FLEET_WAIT_S)
        finally:
            self._bus.expect(qid, None)
        missing = [r for r in others if r not in replies]
        if missing:
            log.warning("guard: fleet query: no answer from %s", ", ".join(missing))
        return FleetAnswer(list(replies.values()), missing)
