"""Record sinks the server can use without a store: ``NullSink`` and ``MemorySink``."""

from __future__ import annotations

import threading

from guard.policy import Outcome
from guard.records import DecisionRecord

__all__ = ["MemorySink", "NullSink"]


class NullSink:
    """Drops every record (a guard started without a store)."""

    def write_run(self, outcome: Outcome) -> None:
        return None

    def write_decision(self, record: DecisionRecord) -> None:
        return None


class MemorySink:
    """Keeps records in lists: for tests, the demo and benchmarks. Thread-safe."""

    def __init__(self) -> None:
        self.runs: list[Outcome] = []
        self.decisions: list[DecisionRecord] = []
        # (table, run_id, error, raw text) of each record the guard refused
        self.dead_letters: list[tuple[str, str, str, str]] = []
        self._cond = threading.Condition()

    def write_run(self, outcome: Outcome) -> None:
        with self._cond:
            self.runs.append(outcome)
            self._cond.notify_all()

    def write_decision(self, record: DecisionRecord) -> None:
        with self._cond:
            self.decisions.append(record)
            self._cond.notify_all()

    def dead_letter(self, table: str, run_id: str, error: str, raw: str) -> None:
        """Keep a record the guard refused, with the reason (like the store's dead letter)."""
        with self._cond:
            self.dead_letters.append((table, run_id, error, raw))
            self._cond.notify_all()

    def run(self, run_id: str) -> Outcome | None:
        with self._cond:
            return next((o for o in self.runs if o.run_id == run_id), None)

    def wait_for(self, predicate, timeout: float = 10.0) -> bool:
        """Block until ``predicate(self)`` is true or ``timeout`` passes."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self), timeout)
