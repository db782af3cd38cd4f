"""The run directory of one guard process: each run's session, kept on the run and its session."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from guard.server.control._fanout import AgentSession
    from guard.server.directory._interface import DirectoryHost, Lost
    from guard.server.runs._state import RunState

__all__ = ["LocalDirectory"]


class LocalDirectory:
    """The directory of one process: each run's session, kept on the run and its session."""

    def __init__(self, registry: DirectoryHost) -> None:
        self._runs = registry.runs

    def holder(self, run_id: str) -> AgentSession | None:
        run = self._runs.get(run_id)
        return run.session if run is not None and run.connected else None

    def claim(self, run: RunState, session: AgentSession) -> None:
        if run.session is not None and run.session is not session:
            run.session.runs.discard(run.run_id)
        run.session = session
        session.runs.add(run.run_id)

    def release(self, run: RunState) -> None:
        if run.session is not None:
            run.session.runs.discard(run.run_id)

    def watch(self, run: RunState) -> None:
        """One process: no other replica can hold it."""

    def confirm_lost(self, runs: list[RunState], then: Lost) -> None:
        """One process: no other replica can hold them."""
        for run in runs:
            then(run, False)
