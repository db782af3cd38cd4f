"""The demo's guard: the real guard server and the embedded ClickHouse store, in this process.

The embedded chDB engine allows one process per data directory, so the process that runs the
guard owns the store; the demo reads the final distribution back from that same store after
flushing it. A :class:`TeeSink` sits between the guard and the store so the terminal can show
every decision and termination record the moment the guard writes it.
"""

from __future__ import annotations

import threading
from collections import deque
from pathlib import Path
from typing import Any

from guard.policy._types import Outcome
from guard.store._records import DecisionRecord

__all__ = ["DemoGuard", "TeeSink"]


class TeeSink:
    """A ``RecordSink`` that forwards to the store and keeps a feed for the live display.

    Never blocks or raises (the guard's contract for sinks): the store's own writer is
    non-blocking, and the feed is a bounded deque.
    """

    def __init__(self, store: Any) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._feed: deque[tuple[str, Any]] = deque(maxlen=10_000)
        self.runs_written = 0
        self.decisions_written = 0

    def write_run(self, outcome: Outcome) -> None:
        self.store.write_run(outcome)  # first: a record the store refused is offered again
        with self._lock:
            self.runs_written += 1
            self._feed.append(("run", outcome))

    def write_decision(self, record: DecisionRecord) -> None:
        with self._lock:
            self.decisions_written += 1
            self._feed.append(("decision", record))
        self.store.write_decision(record)

    def flush(self, timeout_s: float = 10.0) -> bool:
        return bool(self.store.flush(timeout_s))

    def drain(self) -> list[tuple[str, Any]]:
        with self._lock:
            items = list(self._feed)
            self._feed.clear()
        return items


class DemoGuard:
    """Starts the guard on a free loopback port with the demo policy and the embedded store."""

    def __init__(self, policy: dict[str, Any], data_dir: Path) -> None:
        self.policy_dict = policy
        self.data_dir = data_dir
        self.store: Any = None
        self.sink: TeeSink | None = None
        self.server: Any = None
        self.endpoint = ""

    async def start(self) -> str:
        """Open the store, start the server on 127.0.0.1:0; returns ``host:port``."""
        from guard.policy import PolicyConfig
        from guard.server import GuardServer
        from guard.store import open_store

        config = PolicyConfig.from_dict(self.policy_dict)
        self.store = open_store(None, data_dir=self.data_dir)
        self.sink = TeeSink(self.store)
        self.server = GuardServer(config, listen="127.0.0.1:0", sink=self.sink)
        await self.server.start()
        self.endpoint = self.server.address
        return self.endpoint

    async def stop(self) -> None:
        """Stop serving (the guard writes what it still holds to the sink first)."""
        if self.server is not None:
            await self.server.stop(drain_s=3.0)
            self.server = None

    def read_back(self, *, since: float) -> list[dict[str, Any]]:
        """Flush the store and read the stop-reason distribution back from ClickHouse."""
        self.store.flush(timeout_s=15.0)
        report = self.store.report(since=since)
        self._report = report
        return [dict(row) for row in report.rows]

    def runs_by_id(self, run_ids: list[str]) -> dict[str, dict[str, str]]:
        """The stored ``otel_guard.runs`` row of each run (after :meth:`read_back` flushed)."""
        if not run_ids:
            return {}
        rows = self.store.query(
            "SELECT run_id, status, reason, decided_by FROM otel_guard.runs FINAL "
            "WHERE run_id IN {ids:Array(String)}",
            {"ids": list(run_ids)},
        )
        return {r[0]: {"status": r[1], "reason": r[2], "decided_by": r[3]} for r in rows}

    def chart(self, path: Path) -> Path | None:
        """Draw the report chart with the code behind ``otel-guard report --chart``."""
        if getattr(self, "_report", None) is None:
            return None
        from guard.store._chart import draw_chart

        draw_chart(self._report, path, bucket_s=60)
        return path if path.exists() else None

    def close(self) -> None:
        if self.store is not None:
            self.store.close(timeout_s=15.0)
            self.store = None
