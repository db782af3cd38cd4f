"""The background writer: memory queue -> batches -> ClickHouse, or the spool when it is down.

One thread. Each cycle it takes up to ``batch_rows`` records (or whatever arrived within
``flush_interval_s``), drops run ids already claimed (in memory) or committed (``_dedup``),
marks the batch in the WAL with a token that is a pure function of the batch
(``{epoch}-{kind}-{lo}-{hi}``) and what it excludes, fsyncs the WAL, inserts with
``insert_deduplication_token`` and then marks it done. While the spool holds anything, new
batches go behind it so ClickHouse receives batches in order. Rows ClickHouse refuses as bad
data go to ``dead_letter`` (``_isolate``); they never block the rows behind them.

Disk full: a batch that neither ClickHouse nor the spool takes is *held* in memory (its
records are acknowledged and in the WAL), in order, and every later batch queues behind it.
The WAL's "done" marker never passes the first held record, so a crash meanwhile recovers
them from the WAL. Each cycle whose jittered backoff is due (``_diskfull.DiskState``) tries
to spool the held batches again; the spool then replays them like any other, with their
tokens, so each is written once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from guard.store._backoff import Backoff
from guard.store._claims import RecordClaims
from guard.store._dedup import CommittedRuns, RecentIds, without
from guard.store._diskfull import DiskState, probe_writable
from guard.store._isolate import bisect_insert, keep_on_disk, split_rows
from guard.store._rows import dead_letter_row
from guard.store._schema import DEAD_LETTER_COLUMNS, DECISION_COLUMNS, RUN_COLUMNS
from guard.store._wal import Spool, Wal

__all__ = ["Writer"]

log = logging.getLogger("guard.store")

# Spool/batch kinds: "r" runs still to be checked against ClickHouse, "R" runs whose content
# and token are final (checked right before their first insert), "d" decisions, "x" dead letter.
_TABLES = {
    "r": ("runs", RUN_COLUMNS),
    "R": ("runs", RUN_COLUMNS),
    "d": ("decisions", DECISION_COLUMNS),
    "x": ("dead_letter", DEAD_LETTER_COLUMNS),
}
_RECENT_RUN_IDS = 100_000


@dataclass(frozen=True, slots=True)
class Shared:
    """What a store and its writer thread share; ``lock`` guards all of it. ``claims``: the
    fleet-wide record claims (``serve --redis``), else ``None``."""

    wal: Wal
    spool: Spool
    lock: threading.Lock
    queue: deque
    counters: dict[str, int]
    epoch: str
    claims: RecordClaims | None
    disk: DiskState


class Writer(threading.Thread):
    """Drains the shared queue into ClickHouse."""

    def __init__(
        self,
        shared: Shared,
        *,
        client_factory: Callable[[], Any],
        database: str,
        batch_rows: int,
        flush_interval_s: float,
    ) -> None:
        super().__init__(name="otel-guard-store-writer", daemon=True)
        self._s = shared
        self._client_factory = client_factory
        self.client: Any = None
        self._db = database
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
        # ClickHouse down: retry from 0.25 s to 30 s, jittered so replicas don't retry in step
        self._ch_retry = Backoff(min_s=0.25, max_s=30.0)
        self._recent = RecentIds(_RECENT_RUN_IDS)
        self.committed = CommittedRuns(database)
        # Batches neither ClickHouse nor the spool took (disk full), in order:
        # (kind, token, rows, lo). held_rows is read by the store under the lock.
        self.held: deque[tuple[str, str, list[str], int]] = deque()
        self.held_rows = 0
        self.held_failed_at = 0.0  # monotonic time of the last failed attempt to spool them
        self._held_written = 0  # spooled since the episode began (for the INFO line)
        self._done_hi = 0  # every record up to this seq was processed (delivered or held)
        self._marked_hi = 0  # the WAL's last "done" marker

    # -- thread ---------------------------------------------------------------------------

    def run(self) -> None:
        while True:
            self.wake.wait(self.flush_interval_s)
            self.wake.clear()
            stopping = self.stopping
            try:
                self._drain()
                self._retry_held()
                self._replay()
                if self._s.claims is not None:  # what was stored while Redis was down
                    self._s.counters["records_claim_conflicts"] += self._s.claims.backfill()
            except Exception:  # never let the thread die: records are safe in the WAL
                log.exception("store writer cycle failed; retrying")
                time.sleep(0.2)
            with self._s.lock:  # set idle under the lock: _accept clears it under the lock
                caught_up = self._next_seq > self.last_seq and not self.overflow
                caught_up = caught_up and not self.held  # held: in memory (and the WAL) only
                self.caught_up = caught_up
                if caught_up and not self._s.spool.pending:
                    self.idle.set()
            # Stopping with records held (the disk refused them this cycle): they stay in
            # the WAL, which close() keeps, and the next open recovers them.
            if stopping and (caught_up or self.held):
                return

    def _drain(self) -> None:
        while True:
            with self._s.lock:
                overflow, self.overflow = self.overflow, False
                last = self.last_seq
            if overflow:  # read what never reached memory back from the WAL
                items = self._from_wal(self._next_seq, last)
                for i in range(0, len(items), self.batch_rows):
                    self._process(items[i : i + self.batch_rows])
                self._next_seq = max(self._next_seq, last + 1)
                continue
            q = self._s.queue  # in seq order (appended under the lock): stale items are a prefix
            while q and q[0][0] < self._next_seq:
                q.popleft()
            items = [q.popleft() for _ in range(min(len(q), self.batch_rows))]
            if not items:
                return
            if items[0][0] > self._next_seq:  # a gap (a failed cycle): the WAL has it
                items = self._from_wal(self._next_seq, items[0][0] - 1) + items
            self._process(items)
            if len(self._s.queue) < self.batch_rows and not self.stopping:
                return  # wait for a full batch or the next tick

    def _from_wal(self, lo: int, hi: int) -> list[tuple[int, str, str, str]]:
        """Records lo..hi from the WAL, plus any still queued (a record whose WAL append
        failed lives only in the queue)."""
        with self._s.lock:
            paths = self._s.wal.segments()
        found = {rec[0]: (*rec, _key(rec)) for rec in self._s.wal.read_range(paths, lo, hi)}
        while self._s.queue and self._s.queue[0][0] <= hi:
            item = self._s.queue.popleft()
            if item[0] >= lo:
                found.setdefault(item[0], item)
        return [found[seq] for seq in sorted(found)]

    def _process(self, items: list[tuple[int, str, str, str]]) -> None:
        lo, hi = items[0][0], items[-1][0]
        batches: list[tuple[str, str, list[str], list[str], bool]] = []
        kinds = set(list(zip(*items, strict=True))[1])
        for kind in ("r", "d", "x"):
            if kind in kinds:  # the common batch is runs only: no per-item filtering
                part = items if len(kinds) == 1 else [it for it in items if it[1] == kind]
                _, _, rows, keys = (list(col) for col in zip(*part, strict=True))
                token = f"{self._s.epoch}-{kind}-{lo}-{hi}"
                batch: tuple[str, str, list[str], list[str], bool] = (kind, token, rows, [], False)
                batches.append(self._runs_batch(token, rows, keys) if kind == "r" else batch)
        try:
            with self._s.lock:
                for kind, token, _, excluded, final in batches:
                    self._s.wal.mark_batch(kind.lower(), lo, hi, token, excluded, final)
            self._s.wal.fsync()
        except OSError as ex:  # markers only make a crash-replay reuse the token: go on
            (log.debug if self._s.disk.full else log.error)(
                "store: WAL marker write failed (%s); delivering batch %d-%d anyway", ex, lo, hi
            )
        for kind, token, rows, _, _ in batches:
            if rows:
                self._deliver(kind, token, rows, lo)
        self._done_hi = hi
        self._mark_done()
        self._next_seq = hi + 1

    def _mark_done(self) -> None:
        """Mark the WAL done up to the last processed record, but never past the first
        held one: held records exist in memory only, besides the WAL."""
        done = self._held_lo() - 1 if self.held else self._done_hi
        if done <= self._marked_hi:
            return
        try:
            with self._s.lock:
                self._s.wal.mark_done(done)
                self._s.wal.retire(done)
            self._marked_hi = done
        except OSError as ex:  # marked again after the next batch
            (log.debug if self._s.disk.full else log.error)(
                "store: WAL done-marker write failed (%s)", ex
            )

    def _held_lo(self) -> int:
        return self.held[0][3]

    def _runs_batch(
        self, token: str, batch_rows: list[str], batch_ids: list[str]
    ) -> tuple[str, str, list[str], list[str], bool]:
        """(kind, token, rows, excluded run ids, final) for one batch of run records.

        First record wins, like the guard's own dedup by run id: repeats of ids this process
        claimed are dropped in memory, and when ClickHouse can be asked right now (nothing
        spooled ahead), ids already committed by any process are dropped too and the batch is
        final ("R"). Otherwise ("r") it is checked again right before its replay.
        """
        excluded: dict[str, None] = {}
        if len(set(batch_ids)) == len(batch_ids) and self._recent.isdisjoint(batch_ids):
            rows, ids = batch_rows, batch_ids  # no repeat at all (the common case)
        else:
            rows, ids, mine = [], [], set()
            for row, run_id in zip(batch_rows, batch_ids, strict=True):
                if run_id in mine:  # a repeat within the batch: first wins, nothing to mark
                    self._s.counters["deduplicated"] += 1
                elif run_id in self._recent:
                    self._s.counters["deduplicated"] += 1
                    excluded[run_id] = None
                else:
                    mine.add(run_id)
                    rows.append(row)
                    ids.append(run_id)
        self._recent.add(ids)
        if rows and self._s.claims is not None:  # before anything is written under its token
            held = self._claimed_elsewhere(ids)
            if held:
                self._s.counters["deduplicated"] += len(held)
                excluded.update(dict.fromkeys(sorted(held)))
                rows, ids = without(rows, ids, held)
        final = False
        if rows and self._live():
            try:
                present = self.committed.present(self._client(), ids)
            except Exception as ex:
                self._mark_down(ex)
            else:
                final = True
                if present:
                    self._s.counters["deduplicated"] += len(present)
                    excluded.update(dict.fromkeys(sorted(present)))
                    rows, ids = without(rows, ids, present)
        self.committed.add(ids)
        return ("R" if final else "r"), token, rows, list(excluded), final

    # -- delivery -------------------------------------------------------------------------

    def _live(self) -> bool:
        """May a batch go to ClickHouse now (nothing spooled or held ahead of it, not
        backing off)?"""
        return not self.held and not self._s.spool.pending and self._ch_retry.due()

    def _client(self) -> Any:
        if self.client is None:
            self.client = self._client_factory()
        return self.client

    def _deliver(self, kind: str, token: str, rows: list[str], lo: int) -> None:
        if kind != "r" and self._live():  # "r": not checked against ClickHouse: spool it
            try:
                self._insert_isolating(kind, token, rows)
                self._ch_retry.reset()
                return
            except Exception as ex:
                self._mark_down(ex)
        self._to_spool(kind, token, rows, lo)

    def _insert_isolating(self, kind: str, token: str, rows: list[str]) -> int:
        """Insert; rows refused as bad data go to dead_letter. Returns rows delivered."""
        bad = bisect_insert(lambda tok, part: self.insert(kind, tok, part), token, rows)
        if bad:
            self._quarantine(kind, token, bad, len(rows))
        delivered = len(rows) - len(bad)
        if kind != "x":
            self._s.counters["written"] += delivered
        return delivered

    def _quarantine(self, kind: str, token: str, bad: list[tuple[str, str]], n: int) -> None:
        table = _TABLES[kind][0]
        refused = bad
        if kind != "x":  # raises when ClickHouse is down: the batch is retried, same tokens
            rows = [dead_letter_row(table, token, err, row) for row, err in bad]
            refused = bisect_insert(lambda tok, p: self.insert("x", tok, p), f"{token}-dl", rows)
        self._s.counters["dead_lettered"] += len(bad)
        log.error(
            "store: ClickHouse refused %d of %d %s rows of batch %s as bad data; quarantined "
            "in %s.dead_letter, the other rows were delivered: %s",
            len(bad),
            n,
            table,
            token,
            self._db,
            bad[0][1][:500],
        )
        if refused:  # the dead-letter row itself was refused: keep it on disk, never lose it
            self._to_file(table, token, refused)

    def _to_file(self, table: str, token: str, bad: list[tuple[str, str]]) -> None:
        path = self._s.spool.path.parent / "dead_letter.log"
        keep_on_disk(path, table, token, bad)
        log.error("store: %d dead-letter records kept in %s", len(bad), path)

    def _to_spool(self, kind: str, token: str, rows: list[str], lo: int) -> None:
        """Spool a batch ClickHouse did not take; when the spool cannot be written either
        (or batches are held already: the spool must keep their order), hold it."""
        if not self.held:
            try:
                self._s.spool.append(kind, token, rows)
            except OSError as ex:
                with self._s.lock:
                    self._s.disk.failed("spool write", ex)
            else:
                if kind != "x":
                    self._s.counters["spooled"] += len(rows)
                return
        with self._s.lock:
            self.held.append((kind, token, rows, lo))
            self.held_rows += len(rows)
            self.held_failed_at = time.monotonic()

    def _retry_held(self) -> None:
        """Spool the held batches, in order, when the backoff is due; probe the data dir
        when nothing is held but the disk was found full (a refused WAL append): the
        condition ends when the disk takes writes again."""
        disk = self._s.disk
        if not disk.full or not disk.due():
            return
        if not self.held:
            error = probe_writable(self._s.spool.path.parent)
            with self._s.lock:
                if error is None and not self.held:
                    disk.cleared()
                else:
                    disk.backoff()
            return
        while self.held:
            kind, token, rows, _ = self.held[0]
            try:
                self._s.spool.append(kind, token, rows)
            except OSError as ex:
                with self._s.lock:
                    self.held_failed_at = time.monotonic()
                    disk.backoff()
                log.debug("store: the held batches still cannot be spooled: %s", ex)
                self._mark_done()
                return
            with self._s.lock:
                self.held.popleft()
                self.held_rows -= len(rows)
            if kind != "x":
                self._s.counters["spooled"] += len(rows)
            self._held_written += len(rows)
        self._mark_done()
        with self._s.lock:
            disk.cleared(self._held_written)
        self._held_written = 0

    def _replay(self) -> None:
        while self._s.spool.pending and self._ch_retry.due():
            progressed = False
            for end, kind, token, n, blob in self._s.spool.peek():
                try:
                    self._replay_one(kind, token, n, blob)
                except Exception as ex:
                    self._mark_down(ex)
                    return
                self._s.spool.advance(end)
                self._ch_retry.reset()
                progressed = True
            if not progressed:
                return

    def _replay_one(self, kind: str, token: str, n: int, blob: str) -> None:
        try:
            rows, keys = split_rows(blob)
        except ValueError as ex:  # a corrupt line: keep its whole text, never retry it forever
            self._s.counters["dead_lettered"] += n
            self._to_file(_TABLES[kind][0], token, [(blob, f"unreadable spooled batch: {ex}")])
            return
        if kind == "r":
            token, excluded = self._replay_decision(token, keys)
            if excluded:
                drop = set(excluded)
                self._s.counters["deduplicated"] += sum(1 for k in keys if k in drop)
                rows, keys = without(rows, keys, drop)
        delivered = self._insert_isolating(kind, token, rows) if rows else 0
        if kind in "rR":
            self.committed.add(keys)
        if kind != "x":
            self._s.counters["replayed"] += delivered

    def _replay_decision(self, token: str, keys: list[str]) -> tuple[str, list[str]]:
        """(token, excluded) for a spooled runs batch not yet checked against ClickHouse.

        Written to disk before the insert: after a crash mid-insert the same rows go again
        with the same token (ClickHouse drops what it has and completes the view), instead of
        a fresh check that would see this batch's own rows and drop them from the view.
        """
        decided = self._s.spool.decided(token)
        if decided is not None:
            return decided
        present = self.committed.present(self._client(), keys)
        if self._s.claims is not None:  # e.g. a recovered WAL record another replica stored since
            present |= self._claimed_elsewhere([k for k in dict.fromkeys(keys) if k not in present])
        excluded = sorted(present)
        final = token
        if excluded:  # other content than any earlier attempt: another token
            final = f"{token}~{hashlib.sha1(' '.join(excluded).encode()).hexdigest()[:12]}"
        self._s.spool.decide(token, final, excluded)
        return final, excluded

    def _claimed_elsewhere(self, ids: list[str]) -> set[str]:
        """Claim ``ids`` fleet-wide (``_claims``); the ones another replica holds. Redis
        unreachable: none (fail open), counted."""
        assert self._s.claims is not None
        held = self._s.claims.claim(ids)
        if held is None:
            self._s.counters["records_unclaimed"] += len(ids)
            return set()
        if held:
            self._s.counters["records_claimed_elsewhere"] += len(held)
            log.info("store: %d run records are another replica's; not stored here", len(held))
        return held

    def _mark_down(self, ex: Exception) -> None:
        self.failed_at = time.monotonic()
        wait_s = self._ch_retry.failed()
        log.warning("store: ClickHouse insert failed (%s); spooling, retry in %.2fs", ex, wait_s)

    def retry_now(self) -> None:
        """Forget the backoff (flush/close want the spool replayed now)."""
        self._ch_retry.retry_now()

    def insert(self, kind: str, token: str, rows: str | list[str]) -> None:
        """One idempotent insert of JSONCompactEachRow rows (a blob or a list of row JSON).

        The same token never lands twice (see _schema.DEDUP_WINDOW); ClickHouse parses the
        rows natively, so the writer does no per-row work in Python.
        """
        client = self._client()
        table, columns = _TABLES[kind]
        blob = rows if isinstance(rows, str) else " ".join(rows)
        client.raw_insert(
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
