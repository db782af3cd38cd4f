"""The run directory shared by the replicas: which replica holds each run's
control stream, and what another replica needs to guard the run.

**Keys** (``P`` = ``prefix``):

=====================  ======  =============================================================
``P:run:<run_id>``     hash    ``r`` replica id, ``s`` ``l`` (live) or ``e`` (ended), ``t``
                               tenant, ``a`` agent, ``p`` parent run, ``pid`` process id,
                               ``l`` the effective ``pb.Limits`` (base64). TTL ``ttl_s``
                               while live, renewed every ``heartbeat_s``; ``tombstone_s``
                               once ended (late lookups learn "ended")
``P:replicas``         zset    replica id -> expiry (ms, Unix): the live replicas (fleet
                               admin waits for each one's answer)
=====================  ======  =============================================================

Memory: ``benchmarks/bench_directory_memory.py`` (``MEMORY USAGE`` of the run hashes) prints
the bytes per 1,000 runs.

The registry never awaits: :meth:`RedisDirectory.claim` / :meth:`release` change the local
view (the :class:`~guard.server.directory._local.LocalDirectory` underneath) and queue the change; a
task of this part sends the queued changes in one pipeline per batch, renews every held run's
TTL in batched pipelines each ``heartbeat_s``, and looks up the runs the registry asked
about (:meth:`watch`: a provisional run whose spans came here while its stream may be held
elsewhere), and before the sweep ends a run as agent_lost, says whether another replica holds
it now (:meth:`confirm_lost`, :mod:`~guard.server.directory._lost`). Redis unreachable: the
calls fail fast (``StateUnavailable``), the replica goes on guarding the runs it holds, and
once Redis answers again every held entry is written anew.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from guard.errors import StateUnavailable
from guard.server._redis._client import StateClient
from guard.server.directory._entry import DirEntry
from guard.server.directory._interface import DirectoryHost, Lost
from guard.server.directory._local import LocalDirectory
from guard.server.directory._lost import LostRuns
from guard.wire import limits_to_pb

if TYPE_CHECKING:  # pragma: no cover
    from guard.server.runs._state import RunState

__all__ = ["DirEntry", "RedisDirectory"]

log = logging.getLogger("guard.server")

LOOKUP_TRIES = 10  # a provisional run is looked up this often (its registration may race)
LOOKUP_RETRY_S = 0.1
_BATCH = 1000  # commands per pipeline
# Marks ended only the entries this replica still holds (a run that moved keeps its entry).
_RELEASE_LUA = """
for i, k in ipairs(KEYS) do
  if redis.call('HGET', k, 'r') == ARGV[1] then
    redis.call('HSET', k, 's', 'e'); redis.call('PEXPIRE', k, ARGV[2])
  end
end
return 0
"""
# Renews the entries this replica holds; says who holds each other one (0: nobody, lapsed).
_RENEW_LUA = """
local out = {}
for i, k in ipairs(KEYS) do
  local r = redis.call('HGET', k, 'r')
  if r == ARGV[1] then redis.call('PEXPIRE', k, ARGV[2]); out[i] = 1
  elseif r then out[i] = r else out[i] = 0 end
end
return out
"""


class RedisDirectory:
    """The run directory of one replica (see the module docstring)."""

    def __init__(
        self,
        registry: DirectoryHost,
        state: StateClient,
        *,
        guard_id: str,
        prefix: str = "og",
        ttl_s: float = 5.0,
        heartbeat_s: float = 1.0,
        tombstone_s: float = 60.0,
    ) -> None:
        self._local = LocalDirectory(registry)
        self.holder = self._local.holder
        self._registry = registry
        self.state = state
        self.guard_id = guard_id
        self._p = prefix
        self.ttl_ms = int(ttl_s * 1000)
        self.heartbeat_s = heartbeat_s
        self.tombstone_ms = int(tombstone_s * 1000)
        self.held: dict[str, Any] = {}  # run id -> RunState whose stream this replica holds
        self._claims: dict[str, Any] = {}  # queued writes
        self._ends: set[str] = set()  # queued tombstones
        self._lookups: dict[str, int] = {}  # run id -> lookups left
        self._reclaim = False
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.stats = {"claims": 0, "ends": 0, "renewals": 0, "lookups": 0, "failures": 0}
        self.lost = LostRuns(self, registry)  # the sweep's questions before agent_lost

    def key(self, run_id: str) -> str:
        return f"{self._p}:run:{run_id}"

    @property
    def replicas_key(self) -> str:
        return f"{self._p}:replicas"

    # -- the registry's calls (synchronous) -------------------------------------------------
    def claim(self, run: RunState, session: Any) -> None:
        self._local.claim(run, session)
        self.held[run.run_id] = run
        self._claims[run.run_id] = run
        self._ends.discard(run.run_id)
        self._poke()

    def release(self, run: RunState) -> None:
        self._local.release(run)
        if self.held.get(run.run_id) is run:
            del self.held[run.run_id]
            self._claims.pop(run.run_id, None)
            self._ends.add(run.run_id)
            self._poke()

    def watch(self, run: Any) -> None:
        """Find out where ``run`` (a provisional run: spans came first) is held; the answer
        goes to ``registry.located(run_id, entry)``."""
        if run.run_id not in self._lookups:
            self._lookups[run.run_id] = LOOKUP_TRIES
            self._poke()

    def confirm_lost(self, runs: list[Any], then: Lost) -> None:
        """Who holds the streams of ``runs`` (the sweep's candidates for agent_lost) now:
        this part's task answers for all of them in one round trip (``_lost.LostRuns``)."""
        self.lost.ask(runs, then)
        if runs:
            self._poke()

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # -- background work ----------------------------------------------------------------------
    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        # The runs still held are NOT marked ended: their agents fail over to another replica
        # and re-register there (that claim moves the entry; else it lapses within ttl_s).
        with contextlib.suppress(StateUnavailable):
            await self._send_ends(self._ends)
            await self.state.pipeline([("ZREM", self.replicas_key, self.guard_id)])

    async def _run(self) -> None:
        assert self._wake is not None
        next_beat = 0.0
        while True:
            now = time.monotonic()
            wait = next_beat - now
            if self._lookups or self.lost.pending:
                wait = min(wait, LOOKUP_RETRY_S)
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
            self._wake.clear()
            try:
                if self._reclaim:  # Redis is back: every held entry is written anew
                    self._claims.update(self.held)
                await self.flush()
                await self._resolve()
                await self.lost.answer()
                if time.monotonic() >= next_beat:
                    await self.beat()
                    next_beat = time.monotonic() + self.heartbeat_s
                if self._reclaim:
                    log.info("guard: run directory re-claimed (%d runs)", len(self.held))
                self._reclaim = False
            except StateUnavailable as exc:
                if not self._reclaim:
                    log.warning("guard: run directory unavailable: %s", exc)
                self.stats["failures"] += 1
                self._reclaim = True
                self.lost.unanswered()
                next_beat = time.monotonic() + self.heartbeat_s
                await asyncio.sleep(0.1)
            except asyncio.CancelledError:
                raise
            except Exception:  # never end the task: the directory must keep going
                log.exception("guard: run directory task failed")
                await asyncio.sleep(0.1)

    def _fields(self, run: Any) -> list[str]:
        limits = base64.b64encode(limits_to_pb(run.budget.limits).SerializeToString()).decode()
        session = run.session
        pid = session.process_id if session is not None else ""
        return [
            *("r", self.guard_id, "s", "l", "t", run.tenant, "a", run.agent),
            *("p", run.parent_run_id, "pid", pid, "l", limits),
        ]

    async def flush(self) -> None:
        """Send the queued claims and tombstones (kept for the next try when Redis fails)."""
        claims, self._claims = self._claims, {}
        ends, self._ends = self._ends, set()
        try:
            items = list(claims.values())
            for i in range(0, len(items), _BATCH // 2):
                cmds: list[tuple[Any, ...]] = []
                for run in items[i : i + _BATCH // 2]:
                    k = self.key(run.run_id)
                    cmds += [("HSET", k, *self._fields(run)), ("PEXPIRE", k, self.ttl_ms)]
                await self.state.pipeline(cmds)
            self.stats["claims"] += len(items)
            await self._send_ends(ends)
        except BaseException:
            for rid, run in claims.items():
                if self.held.get(rid) is run:
                    self._claims.setdefault(rid, run)
            self._ends |= ends - set(self._claims)
            raise

    async def _send_ends(self, ends: set[str]) -> None:
        ids = sorted(ends)
        for i in range(0, len(ids), _BATCH):
            keys = [self.key(r) for r in ids[i : i + _BATCH]]
            cmd = ("EVAL", _RELEASE_LUA, len(keys), *keys, self.guard_id, self.tombstone_ms)
            await self.state.pipeline([cmd])
        self.stats["ends"] += len(ids)

    async def beat(self) -> None:
        """The heartbeat: this replica is live, and so is each entry it holds (an entry that
        lapsed meanwhile, or that another replica took over, is looked at again)."""
        now_ms = int(time.time() * 1000)
        await self.state.pipeline(
            [
                ("ZADD", self.replicas_key, now_ms + self.ttl_ms, self.guard_id),
                ("ZREMRANGEBYSCORE", self.replicas_key, "-inf", now_ms),
                ("PEXPIRE", self.replicas_key, self.ttl_ms * 4),
            ]
        )
        ids = list(self.held)
        for i in range(0, len(ids), _BATCH):
            chunk = ids[i : i + _BATCH]
            keys = [self.key(r) for r in chunk]
            cmd = ("EVAL", _RENEW_LUA, len(keys), *keys, self.guard_id, self.ttl_ms)
            (out,) = await self.state.pipeline([cmd])
            lost = []
            for rid, holder in zip(chunk, out, strict=True):
                if holder == 1:
                    self.stats["renewals"] += 1
                elif holder == 0:
                    lost.append(rid)  # lapsed (Redis blip or restart): written again
                else:
                    self._moved(rid, holder)
            for rid in lost:
                if rid in self.held:
                    self._claims[rid] = self.held[rid]
        if self._claims:
            await self.flush()
        await self._check_remote()

    def _moved(self, run_id: str, holder: str) -> None:
        """Another replica re-registered the run (its agent failed over): it holds it now."""
        run = self.held.get(run_id)
        if run is None:
            return
        if run.connected:  # its agent's live stream is here: the entry is ours again
            self._claims[run_id] = run
            return
        del self.held[run_id]
        self._registry.moved_away(run, holder)

    async def _resolve(self) -> None:
        if not self._lookups:
            return
        ids = list(self._lookups)
        found = await self.lookup(ids)
        reg = self._registry
        for rid in ids:
            entry = found.get(rid)
            run = reg.runs.get(rid)
            left = self._lookups.pop(rid, 0) - 1
            if run is None or not run.provisional:
                continue  # registered here meanwhile, or gone
            if entry is None or entry.replica == self.guard_id:
                if left > 0:
                    self._lookups[rid] = left  # its registration may still be on its way
                continue
            reg.located(run, entry)

    async def lookup(self, run_ids: list[str]) -> dict[str, DirEntry]:
        """The entries of ``run_ids`` (missing ones absent), one pipeline per batch."""
        out: dict[str, DirEntry] = {}
        for i in range(0, len(run_ids), _BATCH):
            chunk = run_ids[i : i + _BATCH]
            got = await self.state.pipeline([("HGETALL", self.key(r)) for r in chunk])
            self.stats["lookups"] += len(chunk)
            for rid, h in zip(chunk, got, strict=True):
                entry = DirEntry.parse(h)
                if entry is not None:
                    out[rid] = entry
        return out

    async def _check_remote(self) -> None:
        """The runs guarded here whose streams other replicas hold: ended, or moved?"""
        reg = self._registry
        remote = [r.run_id for r in list(reg.runs.values()) if r.remote is not None]
        if not remote:
            return
        found = await self.lookup(remote)
        for rid in remote:
            run = reg.runs.get(rid)
            entry = found.get(rid)
            if run is None or run.remote is None or entry is None:
                continue  # a lapsed entry: its agent re-registers somewhere, or idles out
            if entry.ended:
                reg.ended_remotely(run)
            elif entry.replica != run.remote:
                if entry.replica == self.guard_id:
                    continue  # it re-registered here: register() adopts it
                reg.remote_moved(run, entry.replica)

    async def replicas(self) -> list[str]:
        """The live replicas (this one included)."""
        (ids,) = await self.state.pipeline([self.live_cmd()])
        return list(ids)

    def live_cmd(self) -> tuple[Any, ...]:
        return ("ZRANGEBYSCORE", self.replicas_key, int(time.time() * 1000), "+inf")
