"""Before a replica ends a run as agent_lost: who holds the run's stream *now*?

The sweep (``Lifecycle.sweep``) ends a detached run whose agent did not come back within
``agent_grace_s``, and a provisional run nobody registered, as agent_lost. With replicas the
agent may have re-registered on another replica that this one has not heard of yet: the word
of the move comes with the directory's heartbeat (``RedisDirectory.beat``), a heartbeat apart
at best, later with a slow Redis or a busy loop. An agent_lost written then would be the
fleet's first record of the run, and records are first-wins: the fleet would keep the wrong
one. So the sweep asks first (``RunDirectory.confirm_lost``), and :class:`LostRuns` answers
for all its candidates from one pipeline (their entries and the live replicas):

* the entry is another replica's, live or ended there: the run is handed over (a detached run
  through ``registry.moved_away``, a provisional one through ``registry.located``) and that
  replica writes its one record;
* the entry lapsed (its holder's renewals stopped, or Redis restarted empty): asked again for
  ``lapse_wait_s`` (two heartbeats: a live holder writes its entry again within one);
* otherwise (the entry is this replica's, its holder died, it never came back): the run is
  this replica's to end. So is every candidate while Redis does not answer for ``ttl_s``
  (fail-open, like the tenant budgets), so no run waits for Redis forever.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from guard.server.directory._entry import DirEntry
from guard.server.directory._interface import DirectoryHost, Lost

if TYPE_CHECKING:  # pragma: no cover
    from guard.server.runs._state import RunState

__all__ = ["LostRuns"]

log = logging.getLogger("guard.server")


class LostRuns:
    """The sweep's questions to the run directory ``directory`` (a ``RedisDirectory``) of
    ``registry``: asked from the registry at once, answered from the directory's task."""

    def __init__(self, directory: Any, registry: DirectoryHost) -> None:
        self.d = directory
        self.registry = registry
        self.lapse_wait_s = 2 * directory.heartbeat_s
        # run id -> (run, its answer, when asked)
        self.pending: dict[str, tuple[Any, Lost, float]] = {}
        directory.stats |= {"lost_handed_over": 0, "lost_unconfirmed": 0}

    def ask(self, runs: list[Any], then: Lost) -> None:
        asked = time.monotonic()
        self.pending.update((run.run_id, (run, then, asked)) for run in runs)

    async def answer(self) -> None:
        """One pipeline for every pending question (see the module docstring)."""
        if not self.pending:
            return
        d, asked, self.pending = self.d, self.pending, {}
        ids = list(asked)  # at most a few sweep slices (256 runs each): one pipeline
        try:
            *got, live = await d.state.pipeline(
                [*(("HGETALL", d.key(r)) for r in ids), d.live_cmd()]
            )
        except BaseException:
            self.pending = asked | self.pending  # retried: Redis may answer soon
            raise
        d.stats["lookups"] += len(ids)
        live, now = set(live), time.monotonic()
        for rid, h in zip(ids, got, strict=True):
            (run, then, at), entry, moved = asked[rid], DirEntry.parse(h), False
            if entry is None and now - at < self.lapse_wait_s:
                self.pending.setdefault(rid, (run, then, at))  # its holder may write it again
                continue
            try:
                if entry is not None and entry.replica != d.guard_id:
                    moved = (entry.ended or entry.replica in live) and self._hand_over(run, entry)
            except Exception:
                log.exception("guard: handing the run %r over failed", rid[:64])
            _answer(then, run, moved)

    def _hand_over(self, run: RunState, entry: DirEntry) -> bool:
        """``entry``'s replica holds ``run``'s stream: guard it here as its remote run (False:
        the run is not what was asked about any more; it came back here, or ended)."""
        reg = self.registry
        if reg.runs.get(run.run_id) is not run or run.connected:
            return False
        self.d.stats["lost_handed_over"] += 1
        if run.provisional:
            reg.located(run, entry)
            return True
        if self.d.held.get(run.run_id) is run:
            del self.d.held[run.run_id]  # as RedisDirectory._moved: no tombstone from here
        reg.moved_away(run, entry.replica)
        return True

    def unanswered(self) -> None:
        """Redis is down: questions asked over ``ttl_s`` ago are ours to end (fail-open)."""
        cutoff = time.monotonic() - self.d.ttl_ms / 1000
        for rid, (run, then, asked) in list(self.pending.items()):
            if asked <= cutoff:
                del self.pending[rid]
                self.d.stats["lost_unconfirmed"] += 1
                _answer(then, run, False)


def _answer(then: Lost, run: Any, moved: bool) -> None:
    try:  # one failing answer must not keep the others (nor the next sweeps) waiting
        then(run, moved)
    except Exception:
        log.exception("guard: ending the lost run %r failed", run.run_id[:64])
