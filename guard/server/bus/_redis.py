"""The directive bus of the replicas: a Redis stream per replica.

``P:bus:<replica>`` is a stream (``XADD`` with ``MAXLEN ~``; its TTL is renewed by every
write, so a dead replica's stream lapses). Its replica reads it with ``XREAD BLOCK`` on a
connection of its own. Three kinds of entries: ``d`` a decision for a run whose stream that
replica holds, ``q`` a fleet query (Cancel / ListRuns by selector) and ``a`` an answer to a
query of that replica.

**Why a stream, not pub/sub.** A pub/sub message published while the subscriber's connection
is down (a Redis blip, a reconnect) is gone, silently. A stream keeps it: the reader resumes
from the last id it read, so a cancel published during the blip is read when the connection
is back. On the sending side, an entry that could not be written stays in an outbox and is
retried until it is written or :data:`~guard.server.control._fanout.ACK_TIMEOUT_S` passed; a
decision given up then is written here, without a latency, so it is never lost silently.
A retried write may have reached Redis before the connection broke: each entry carries an
id and the reader drops one it has seen (so a cancel never arrives twice).

**Who writes the decision record.** The replica that holds the run's stream: it pushes the
directive and writes the record on the agent's ack, with the delivery latency, exactly as
for its own decisions. The deciding replica writes nothing (unless the bus gave up).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from guard.errors import StateUnavailable
from guard.records import DecisionRecord
from guard.server._redis._client import StateClient
from guard.server.bus._interface import BusHost
from guard.server.bus._local import LocalBus
from guard.server.control._fanout import ACK_TIMEOUT_S

__all__ = ["RedisBus"]

log = logging.getLogger("guard.server")

BLOCK_MS = 1000
STREAM_MAXLEN = 10_000
STREAM_TTL_MS = 60_000
_SEEN_IDS = 8192  # entry ids remembered to drop a retried write read twice
_RECORD_FIELDS = (
    "decided_at",
    "run_id",
    "tenant",
    "agent",
    "action",
    "reason",
    "detail",
    "utilisation",
    "metric",
    "decided_by",
)


def record_to_json(record: DecisionRecord) -> dict[str, Any]:
    return {f: getattr(record, f) for f in _RECORD_FIELDS}


def record_from_json(body: dict[str, Any]) -> DecisionRecord:
    fields: dict[str, Any] = {f: body.get(f) for f in _RECORD_FIELDS}
    return DecisionRecord(**fields)


class RedisBus:
    """The directive bus of one replica (see the module docstring)."""

    def __init__(
        self, registry: BusHost, state: StateClient, *, guard_id: str, prefix: str = "og"
    ) -> None:
        self._registry = registry
        self.state = state
        self.guard_id = guard_id
        self._p = prefix
        self._local = LocalBus()
        self._reader = state.blocking(BLOCK_MS)
        self._outbox: list[tuple[float, str, str, dict[str, Any]]] = []  # (at, replica, kind, body)
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._answers: dict[str, Callable[[dict[str, Any]], None]] = {}
        self._wake: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.fleet: Any = None  # the replicas' GuardAdmin (a _fleet.Fleet), set by redis_parts
        self.stats = {"sent": 0, "received": 0, "retried": 0, "given_up": 0, "duplicates": 0}

    def stream(self, replica: str) -> str:
        return f"{self._p}:bus:{replica}"

    # -- the registry's call (synchronous) ---------------------------------------------------
    def deliver(self, run: Any, record: DecisionRecord) -> bool:
        """A run held here: its session queues it. A run held by another replica: the
        decision goes to that replica's stream (it pushes it and writes the record)."""
        if run.remote is None:
            return self._local.deliver(run, record)
        self.send(run.remote, "d", {"rec": record_to_json(record)})
        return True

    def send(self, replica: str, kind: str, body: dict[str, Any]) -> str:
        """Queue an entry for ``replica``'s stream; returns its id."""
        body = {"id": uuid.uuid4().hex, **body, "from": self.guard_id}
        self._outbox.append((time.monotonic(), replica, kind, body))
        if self._wake is not None:
            self._wake.set()
        return body["id"]

    def expect(self, query_id: str, on_answer: Callable[[dict[str, Any]], None] | None) -> None:
        """Route the answers to ``query_id`` to ``on_answer`` (``None``: stop routing)."""
        if on_answer is None:
            self._answers.pop(query_id, None)
        else:
            self._answers[query_id] = on_answer

    # -- background work ----------------------------------------------------------------------
    async def start(self) -> None:
        self._wake = asyncio.Event()
        # read from now on (Redis's clock): nothing is missed between start and the first read
        sec, usec = await self._reader.command("TIME")
        self._last = f"{int(sec) * 1000 + int(usec) // 1000}-0"
        self._tasks = [
            asyncio.ensure_future(self._send_forever()),
            asyncio.ensure_future(self._read_forever()),
        ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        with contextlib.suppress(StateUnavailable):
            await self.flush()
        await self._reader.aclose()

    async def _send_forever(self) -> None:
        assert self._wake is not None
        while True:
            if not self._outbox:
                await self._wake.wait()
            self._wake.clear()
            try:
                await self.flush()
            except StateUnavailable:
                self._give_up_old()
                await asyncio.sleep(0.05)  # the client fails fast meanwhile
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("guard: directive bus send failed")
                await asyncio.sleep(0.05)

    async def flush(self) -> None:
        """Write the outbox in one pipeline; kept (and retried) when Redis fails."""
        batch, self._outbox = self._outbox, []
        if not batch:
            return
        cmds: list[tuple[Any, ...]] = []
        for _, replica, kind, body in batch:
            key = self.stream(replica)
            payload = json.dumps(body, separators=(",", ":"))
            cmds.append(("XADD", key, "MAXLEN", "~", STREAM_MAXLEN, "*", "k", kind, "b", payload))
            cmds.append(("PEXPIRE", key, STREAM_TTL_MS))
        try:
            await self.state.pipeline(cmds)
        except BaseException:
            self.stats["retried"] += len(batch)
            self._outbox[:0] = batch
            raise
        self.stats["sent"] += len(batch)

    def _give_up_old(self) -> None:
        now = time.monotonic()
        keep = []
        for item in self._outbox:
            at, replica, kind, body = item
            if now - at < ACK_TIMEOUT_S:
                keep.append(item)
                continue
            self.stats["given_up"] += 1
            if kind == "d":  # the decision happened: its record is written, without latency
                self._registry.log.write(record_from_json(body["rec"]), None)
                log.warning(
                    "guard: decision for run %r not carried to %s",
                    body["rec"]["run_id"][:64],
                    replica,
                )
        self._outbox = keep

    async def _read_forever(self) -> None:
        key = self.stream(self.guard_id)
        while True:
            try:
                got = await self._reader.command(
                    "XREAD", "BLOCK", BLOCK_MS, "STREAMS", key, self._last
                )
            except StateUnavailable:
                await asyncio.sleep(0.1)  # resumes from self._last: nothing written is missed
                continue
            except asyncio.CancelledError:
                raise
            for _, entries in got or ():
                for entry_id, fields in entries:
                    self._last = entry_id
                    try:
                        self._dispatch(fields)
                    except Exception:
                        log.exception("guard: directive bus entry %s failed", entry_id)

    def _dispatch(self, fields: Any) -> None:
        if isinstance(fields, list):  # RESP2 pairs
            fields = dict(zip(fields[::2], fields[1::2], strict=True))
        kind, body = fields.get("k"), json.loads(fields.get("b") or "{}")
        eid = body.get("id", "")
        if eid in self._seen:
            self.stats["duplicates"] += 1
            return
        self._seen[eid] = None
        if len(self._seen) > _SEEN_IDS:
            self._seen.popitem(last=False)
        self.stats["received"] += 1
        reg = self._registry
        if kind == "d":
            reg.remote_decision(record_from_json(body["rec"]))
        elif kind == "q":
            answer = reg.fleet_apply(body)
            self.send(body["from"], "a", {**answer, "q": eid, "id": uuid.uuid4().hex})
        elif kind == "a":
            handler = self._answers.get(body.get("q", ""))
            if handler is not None:
                handler(body)
