"""The directive bus seam: a decision carried to whichever process holds the run's stream.

In one process, the run's own session (:class:`~guard.server.bus._local.LocalBus`); replicas
use a Redis stream per replica (:class:`~guard.server.bus._redis.RedisBus`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from guard.records import DecisionRecord
    from guard.server.control._fanout import DecisionLog
    from guard.server.runs._state import RunState

__all__ = ["BusHost", "DirectiveBus"]


class DirectiveBus(Protocol):
    """Carries a decision to whichever process holds the run's stream."""

    def deliver(self, run: RunState, record: DecisionRecord) -> bool:
        """Push the decision ``record`` to ``run``'s agent; False when nobody holds its
        stream (the caller then writes the record itself)."""


class BusHost(Protocol):
    """What a directive bus may use of the guard that owns it (the run registry)."""

    log: DecisionLog  # where a decision record is written

    def remote_decision(self, record: DecisionRecord) -> None:
        """A decision another replica made for a run whose stream is held here."""

    def fleet_apply(self, query: dict[str, Any]) -> dict[str, Any]:
        """A fleet-wide admin query (cancel, list runs) asked through another replica."""
