"""In-process delivery of directives (one guard process)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from guard.records import DecisionRecord
    from guard.server.runs._state import RunState

__all__ = ["LocalBus"]


class LocalBus:
    """In-process delivery: the run's own :class:`AgentSession` queues the directive."""

    def deliver(self, run: RunState, record: DecisionRecord) -> bool:
        if run.connected:
            run.session.push(record)
            return True
        return False
