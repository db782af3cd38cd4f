"""The background writer: memory queue -> batches -> ClickHouse, or the spool when it is down.

One thread. Each cycle it takes up to ``batch_rows`` records (or whatever arrived within
``flush_interval_s``), marks the batch in the WAL with a token that is a pure function of
the batch (``{epoch}-{kind}-{lo}-{hi}``), fsyncs the WAL, inserts with
``insert_deduplication_token`` and then marks it done. While the spool holds anything, new
batches go behind it so ClickHouse receives batches in order.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from guard.store._schema import DECISION_COLUMNS, RUN_COLUMNS
from guard.store._wal import Spool, Wal

__all__ = ["Writer"]

log = logging.getLogger("guard.store")

_TABLES = {"r": ("runs", RUN_COLUMNS), "d": ("decisions", DECISION_COLUMNS)}
# ClickHouse error codes that mean "this data is bad", not "the server is unavailable".
_DATA_ERRORS = {6, 26, 27, 32, 33, 38, 41, 53, 69, 70, 72, 117, 321}
_CODE_RE = re.compile(r"Code: (\d+)")
_POISON_ATTEMPTS = 5
_RECENT_RUN_IDS = 100_000


class Writer(threading.Thread):
    """Drains ``queue`` into ClickHouse. All shared state is guarded by ``lock``."""

    def __init__(
        self,
        *,
        client_factory: Callable[[], Any],
        database: str,
        wal: Wal,
        spool: Spool,
        lock: threading.Lock,
        queue: deque,
        counters: dict[str, int],
        epoch: str,
        batch_rows: int,
        flush_interval_s: float,
    ) -> None:
        super().__init__(name="otel-guard-store-writer", daemon=True)
        self._client_factory = client_factory
        self.client: Any = None
        self._db = database
        self._wal = wal
        self._spool = spool
        self._lock = lock
        self._q = queue
        self._c = counters
        self._epoch = epoch
        self.batch_rows = batch_rows
        self.flush_interval_s = flush_interval_s
        self.wake = threading.Event()
        self.idle = threading.Event()  # set when everything accepted so far is committed
        self.stopping = False
        self.overflow = False  # records exist in the WAL only (the queue was full)
        self.last_seq = 0  # last seq accepted (set by the store under lock)
        self.caught_up = False  # every accepted record is in ClickHouse or the spool
        self.failed_at = 0.0  # monotonic time of the last failed insert
        self._next_seq = 1
        self._down_until = 0.0
        self._backoff_s = 0.0
        self._poison: dict[str, int] = {}
        self._recent: OrderedDict[str, None] = OrderedDict()

    # -- thread ---------------------------------------------------------------------------

    def run(self) -> None:
        while True:
            self.wake.wait(self.flush_interval_s)
            self.wake.clear()
            stopping = self.stopping
            try:
                self._drain()
                self._replay()
            except Exception:  # never let the thread die: records are safe in the WAL
                log.exception("store writer cycle failed; retrying")
                time.sleep(0.2)
            with self._lock:  # set idle under the lock: _accept clears it under the lock
                caught_up = self._next_seq > self.last_seq and not self.overflow
                self.caught_up = caught_up
                if caught_up and not self._spool.pending:
                    self.idle.set()
            if stopping and caught_up:
                return

    def _drain(self) -> None:
        while True:
            with self._lock:
                overflow, self.overflow = self.overflow, False
                last = self.last_seq
            if overflow:  # read what never reached memory back from the WAL
                items = self._from_wal(self._next_seq, last)
                for i in range(0, len(items), self.batch_rows):
                    self._process(items[i : i + self.batch_rows])
                self._next_seq = max(self._next_seq, last + 1)
                continue
            items = []
            while self._q and len(items) < self.batch_rows:
                item = self._q.popleft()
                if item[0] >= self._next_seq:
                    items.append(item)
            if not items:
                return
            if items[0][0] > self._next_seq:  # a gap (a failed cycle): the WAL has it
                items = self._from_wal(self._next_seq, items[0][0] - 1) + items
            self._process(items)
            if len(self._q) < self.batch_rows and not self.stopping:
                return  # wait for a full batch or the next tick

    def _from_wal(self, lo: int, hi: int) -> list[tuple[int, str, str, str]]:
        """Records lo..hi from the WAL, plus any still queued (a record whose WAL append
        failed lives only in the queue)."""
        with self._lock:
            paths = self._wal.segments()
        found = {rec[0]: (*rec, _key(rec)) for rec in self._wal.read_range(paths, lo, hi)}
        while self._q and self._q[0][0] <= hi:
            item = self._q.popleft()
            if item[0] >= lo:
                found.setdefault(item[0], item)
        return [found[seq] for seq in sorted(found)]

    def _process(self, items: list[tuple[int, str, str, str]]) -> None:
        lo, hi = items[0][0], items[-1][0]
        runs = [(row, key) for _, kind, row, key in items if kind == "r"]
        decisions = [row for _, kind, row, _ in items if kind == "d"]
        batches = []
        if runs:
            batches.append(("r", f"{self._epoch}-r-{lo}-{hi}", self._dedup_runs(runs)))
        if decisions:
            batches.append(("d", f"{self._epoch}-d-{lo}-{hi}", decisions))
        try:
            with self._lock:
                for kind, token, _ in batches:
                    self._wal.mark_batch(kind, lo, hi, token)
            self._wal.fsync()
        except OSError as ex:  # markers only make a crash-replay reuse the token: go on
            log.error(
                "store: WAL marker write failed (%s); delivering batch %d-%d anyway", ex, lo, hi
            )
        for kind, token, rows in batches:
            if rows:
                self._deliver(kind, token, rows)
        try:
            with self._lock:
                self._wal.mark_done(hi)
                self._wal.retire(hi)
        except OSError as ex:
            log.error("store: WAL done-marker write failed (%s)", ex)
        self._next_seq = hi + 1

    def _dedup_runs(self, rows: list[tuple[str, str]]) -> list[str]:
        # The MV counts every inserted row, while `runs` (ReplacingMergeTree) keeps one per
        # run id: dropping repeats here keeps the two in agreement. First record wins, like
        # the guard's own dedup by run id.
        out = []
        for row, run_id in rows:
            if run_id in self._recent:
                self._c["deduplicated"] += 1
                continue
            self._recent[run_id] = None
            out.append(row)
        while len(self._recent) > _RECENT_RUN_IDS:
            self._recent.popitem(last=False)
        return out

    # -- delivery -------------------------------------------------------------------------

    def _deliver(self, kind: str, token: str, rows: list[str]) -> None:
        if not self._spool.pending and time.monotonic() >= self._down_until:
            try:
                self.insert(kind, token, " ".join(rows))
                self._c["written"] += len(rows)
                self._backoff_s = 0.0
                return
            except Exception as ex:
                self._mark_down(ex)
        self._to_spool(kind, token, rows)

    def _to_spool(self, kind: str, token: str, rows: list[str]) -> None:
        try:
            self._spool.append(kind, token, rows)
            self._c["spooled"] += len(rows)
        except OSError as ex:
            with self._lock:
                self._c["dropped"] += len(rows)
            log.error(
                "store: DROPPED %d %s records: ClickHouse unreachable and spool write failed: %s",
                len(rows),
                _TABLES[kind][0],
                ex,
            )

    def _replay(self) -> None:
        while self._spool.pending and time.monotonic() >= self._down_until:
            progressed = False
            for end, kind, token, n, blob in self._spool.peek():
                try:
                    self.insert(kind, token, blob)
                except Exception as ex:
                    if self._is_poison(token, ex):
                        log.error(
                            "store: ClickHouse rejected spooled batch %s (%d rows) %d times; "
                            "moved to %s: %s",
                            token,
                            n,
                            _POISON_ATTEMPTS,
                            self._spool.rejected_path,
                            ex,
                        )
                        self._spool.reject(kind, token, n, blob)
                        self._c["rejected"] += n
                        self._spool.advance(end)
                        progressed = True
                        continue
                    if token in self._poison:  # the server answered: retry soon, no backoff
                        self._down_until = time.monotonic() + 0.2
                    else:
                        self._mark_down(ex)
                    return
                self._poison.pop(token, None)
                self._c["replayed"] += n
                self._c["written"] += n
                self._spool.advance(end)
                self._backoff_s = 0.0
                progressed = True
            if not progressed:
                return

    def _is_poison(self, token: str, ex: Exception) -> bool:
        m = _CODE_RE.search(str(ex))
        if not m or int(m.group(1)) not in _DATA_ERRORS:
            return False
        self._poison[token] = self._poison.get(token, 0) + 1
        return self._poison[token] >= _POISON_ATTEMPTS

    def _mark_down(self, ex: Exception) -> None:
        self.failed_at = time.monotonic()
        self._backoff_s = min(30.0, max(0.25, self._backoff_s * 2))
        self._down_until = time.monotonic() + self._backoff_s
        log.warning(
            "store: ClickHouse insert failed (%s); spooling, retry in %.2fs", ex, self._backoff_s
        )

    def retry_now(self) -> None:
        """Forget the backoff (flush/close want the spool replayed now)."""
        self._down_until = 0.0

    def insert(self, kind: str, token: str, rows: str | list[str]) -> None:
        """One idempotent insert of JSONCompactEachRow rows (a blob or a list of row JSON).

        The same token never lands twice (see _schema.DEDUP_WINDOW); ClickHouse parses the
        rows natively, so the writer does no per-row work in Python.
        """
        if self.client is None:
            self.client = self._client_factory()
        table, columns = _TABLES[kind]
        blob = rows if isinstance(rows, str) else " ".join(rows)
        self.client.raw_insert(
            f"{self._db}.{table}",
            list(columns),
            insert_block=blob.encode(),
            fmt="JSONCompactEachRow",
            settings={
                "insert_deduplication_token": token,
                "insert_deduplicate": 1,
                "deduplicate_blocks_in_dependent_materialized_views": 1,
            },
        )


def _key(rec: tuple[int, str, str]) -> str:
    """The run id of a WAL run record (the dedup key); '' for decisions."""
    return json.loads(rec[2])[0] if rec[1] == "r" else ""
