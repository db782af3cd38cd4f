"""The run directory seam: which agent session holds each run's control stream.

In one process the run table knows (:class:`~guard.server.directory._local.LocalDirectory`);
replicas share it through Redis (:class:`~guard.server.directory._redis.RedisDirectory`).
Synchronous: the registry never awaits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from guard.server.control._fanout import AgentSession
    from guard.server.runs._state import RunState

__all__ = ["DirectoryHost", "Lost", "RunDirectory"]

Lost = Callable[["RunState", bool], None]  # told whether a lost run moved to another replica


class RunDirectory(Protocol):
    """Which agent session holds each run's control stream."""

    def holder(self, run_id: str) -> AgentSession | None:
        """The connected session holding ``run_id``'s stream on this replica, if any."""

    def claim(self, run: RunState, session: AgentSession) -> None:
        """``session`` now holds ``run``'s stream."""

    def release(self, run: RunState) -> None:
        """``run``'s stream is no longer held by its session (it ended or moved)."""

    def watch(self, run: RunState) -> None:
        """Spans made ``run`` (provisional) before its agent registered it here: find out
        whether another replica holds its stream (then ``registry.located(run, entry)``)."""

    def confirm_lost(self, runs: list[RunState], then: Lost) -> None:
        """``runs`` waited past ``agent_grace_s`` for their agents (detached, or provisional
        runs nobody registered): before their records say agent_lost, ask who holds each
        stream *now*. A run another live replica holds is handed over to it (a detached run
        through ``registry.moved_away``, a provisional one through ``registry.located``), so
        that replica writes its one record; ``then(run, moved)`` follows for every run, with
        ``moved`` False when no other replica holds it (the caller ends it). At once in one
        process; with replicas, after one round trip for all of ``runs``."""


class DirectoryHost(Protocol):
    """What a run directory may use of the guard that owns it (the run registry)."""

    runs: dict[str, RunState]  # the live runs, read-only to the part

    def located(self, run: RunState, entry: Any) -> None:
        """Another replica holds the stream of ``run`` (``entry``: its directory entry)."""

    def moved_away(self, run: RunState, holder: str) -> None:
        """A run detached here is now held by the replica ``holder``."""

    def remote_moved(self, run: RunState, holder: str) -> None:
        """A run guarded here for another replica moved to ``holder``."""

    def ended_remotely(self, run: RunState) -> None:
        """A run guarded here for another replica ended there."""
