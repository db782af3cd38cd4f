"""``open_store`` and ``Store``: the RecordSink the guard writes to, and the report read path."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any, Unpack

from guard.errors import ConfigError, StoreError
from guard.policy._types import Outcome
from guard.store._claims import DEFAULT_CLAIM_TTL_S, RecordClaims, holder_id
from guard.store._diskfull import DiskState, RecordNotDurable
from guard.store._dsn import Dsn, connect, parse_dsn
from guard.store._enginelog import forget_uncommitted_blocks
from guard.store._records import DecisionRecord
from guard.store._reporting import Report, ReportQuery, query_report
from guard.store._rows import dead_letter_row, decision_row, encode_row, run_line
from guard.store._schema import migrate
from guard.store._wal import Spool, Wal, lock_dir, recover_to_spool
from guard.store._writer import Shared, Writer

__all__ = ["RecordNotDurable", "Store", "open_store", "read_report"]

log = logging.getLogger("guard.store")

_COUNTERS = (
    "queued", "written", "spooled", "replayed", "dropped", "dead_lettered", "deduplicated",
    "records_claimed_elsewhere", "records_unclaimed", "records_claim_conflicts",
)  # fmt: skip
# Acknowledged records the writer may keep in memory while the disk is full (~0.5 KB each).
DEFAULT_MAX_HELD = 100_000


def open_store(
    dsn: str | None,
    *,
    data_dir: Path | str,
    retention_days: int | None = 90,
    batch_rows: int = 10_000,
    flush_interval_s: float = 0.5,
    max_queue: int = 200_000,
    redis_url: str | None = None,
    guard_id: str | None = None,
    claim_ttl_s: float = DEFAULT_CLAIM_TTL_S,
    max_held: int = DEFAULT_MAX_HELD,
) -> Store:
    """Open (and migrate) the store. ``dsn`` None = embedded ``chdb://{data_dir}/clickhouse``.

    ``data_dir`` also holds the writer's WAL and spool (for http DSNs too), and is locked
    for this process: raises StoreError when another process holds it.

    ``redis_url`` (``serve --redis``): this store is one replica's of several, and each run
    record is claimed fleet-wide before it is inserted (``_claims``; a claim lasts
    ``claim_ttl_s``; ``guard_id`` names this replica in the claims). None: no claims.

    ``max_held``: how many acknowledged records the writer may keep in memory while it can
    neither insert nor spool them (disk full); at that many, :meth:`Store.write_run` refuses
    new run records (:class:`RecordNotDurable`) instead of dropping old ones.
    """
    store = Store(
        parse_dsn(dsn, data_dir=Path(data_dir)),
        data_dir=Path(data_dir),
        retention_days=retention_days,
        batch_rows=batch_rows,
        flush_interval_s=flush_interval_s,
        max_queue=max_queue,
        redis_url=redis_url,
        guard_id=guard_id,
        claim_ttl_s=claim_ttl_s,
        max_held=max_held,
    )
    return store


def read_report(dsn: str | None, *, data_dir: Path | str, **query: Unpack[ReportQuery]) -> Report:
    """One report without a running guard (``otel-guard report --clickhouse``/fallback).

    A server DSN is read with a plain client: no WAL, no spool, no data-dir lock, so it
    works next to a guard that uses the same ``data_dir``. An embedded DSN needs the engine
    itself, so the store is opened (which also replays what a crashed guard left behind).
    """
    parsed = parse_dsn(dsn, data_dir=Path(data_dir))
    if parsed.embedded:
        assert parsed.path is not None
        embedded_dir = Path(data_dir) if dsn is None else parsed.path.parent
        with open_store(dsn, data_dir=embedded_dir, retention_days=None) as store:
            return store.report(**query)
    try:
        client = connect(parsed)
    except Exception as ex:
        raise StoreError(f"cannot reach {parsed.redacted()}: {ex}") from ex
    try:
        return query_report(client, parsed.database, **query)
    except Exception as ex:
        raise StoreError(f"report from {parsed.redacted()} failed: {ex}") from ex
    finally:
        client.close()


class Store:
    """ClickHouse-backed RecordSink. ``write_run``/``write_decision`` never block.

    ``write_run`` raises :class:`RecordNotDurable` (and only that) when the record did not
    reach the WAL: the data dir cannot be written (disk full, I/O error) or ``max_held``
    acknowledged records already wait in memory. The caller must not acknowledge such a
    record. ``write_decision`` and ``dead_letter`` never raise (nobody acknowledges them).
    """

    def __init__(
        self,
        dsn: Dsn,
        *,
        data_dir: Path,
        retention_days: int | None,
        batch_rows: int,
        flush_interval_s: float,
        max_queue: int,
        redis_url: str | None = None,
        guard_id: str | None = None,
        claim_ttl_s: float = DEFAULT_CLAIM_TTL_S,
        max_held: int = DEFAULT_MAX_HELD,
    ) -> None:
        self.dsn = dsn
        self.database = dsn.database
        self.data_dir = data_dir
        base = data_dir / "store"
        base.mkdir(parents=True, exist_ok=True)
        self._lock_fd = lock_dir(base / "lock")
        self._lock = threading.Lock()
        self._q: deque = deque()
        self._max_queue = max_queue
        self._max_held = max_held
        self.disk = DiskState()  # guarded by self._lock, shared with the writer
        self._counters = dict.fromkeys(_COUNTERS, 0)
        self._closed = False
        self._seq = 0
        self._read_client: Any = None
        self._read_lock = threading.Lock()
        try:
            self._epoch = uuid.uuid4().hex[:12]
            self._wal = Wal(base / "wal", epoch=self._epoch)
            self._spool = Spool(base)
            self._recover()
            self._retention_days = retention_days
            self._migrated = False
            self.claims = None
            if redis_url is not None:  # connects lazily: a Redis down at start is not fatal
                holder = holder_id(base, guard_id)
                self.claims = RecordClaims(redis_url, holder, ttl_s=claim_ttl_s)
            if dsn.embedded:  # the engine died with us? then its dedup log may lie (see module)
                assert dsn.path is not None
                forget_uncommitted_blocks(dsn.path)
            client = self._connect_writer(at_open=True)
        except Exception as ex:
            self._release()
            if isinstance(ex, StoreError | ConfigError):
                raise
            raise StoreError(f"cannot open store {dsn.redacted()}: {ex}") from ex
        parts = (self._wal, self._spool, self._lock, self._q, self._counters, self._epoch)
        shared = Shared(*parts, claims=self.claims, disk=self.disk)
        self._writer = Writer(
            shared,
            client_factory=self._connect_writer,
            database=self.database,
            batch_rows=batch_rows,
            flush_interval_s=flush_interval_s,
        )
        self._writer.client = client
        self._writer.start()

    def _connect_writer(self, *, at_open: bool = False) -> Any:
        """A client with the schema migrated. A ClickHouse *server* that cannot be reached
        at start is not fatal: the guard starts, the writer spools, and the migrations run
        on the first successful connect. (Bad credentials or DDL errors still raise.)"""
        from clickhouse_connect.driver.exceptions import OperationalError

        client = None
        try:
            client = connect(self.dsn)
            if not self._migrated:
                migrate(client, self.database, retention_days=self._retention_days)
                self._migrated = True
            return client
        except OperationalError as ex:
            if client is not None:
                client.close()
            if not (at_open and not self.dsn.embedded):
                raise
            log.warning(
                "store: ClickHouse %s unreachable at start (%s); spooling until it is back",
                self.dsn.redacted(),
                ex,
            )
            return None
        except Exception:
            if client is not None:
                client.close()
            raise

    def _recover(self) -> None:
        n = recover_to_spool(self._wal, self._spool)
        if n:
            self._counters["spooled"] += n
            log.warning("store: recovered %d records from the WAL of a previous process", n)

    # -- RecordSink -----------------------------------------------------------------------

    def write_run(self, outcome: Outcome) -> None:
        """Queue one ``runs`` row. Durable (WAL) on return; never blocks on ClickHouse.

        Raises :class:`RecordNotDurable` when it is not durable (see the class): then the
        store holds nothing of it, and the record must be offered again later.

        A record that cannot become a row (e.g. a timestamp past year 2299) is not dropped:
        it goes to ``dead_letter`` with its raw text and the reason.
        """
        try:
            line, run_id = run_line(outcome)
        except Exception as ex:  # the contract: never raise into the guard
            self._dead_letter("runs", outcome, ex)
            return
        self._accept("r", line, run_id, durable=True)

    def write_decision(self, record: DecisionRecord) -> None:
        """Queue one ``decisions`` row. Same guarantees as :meth:`write_run`."""
        try:
            line = encode_row(decision_row(record))
        except Exception as ex:
            self._dead_letter("decisions", record, ex)
            return
        self._accept("d", line, "")

    def dead_letter(self, table: str, run_id: str, error: str, raw: str) -> None:
        """Keep a record the guard refused (e.g. a RunEnded outside the input bounds) in
        ``dead_letter``: its raw text and the reason, durable (WAL) on return. Same
        guarantees as :meth:`write_run`; one WARNING line, as the sender was told."""
        log.warning(
            "store: refused %s record for run %.80r (%s); kept in %s.dead_letter",
            table,
            run_id,
            " ".join(error.split())[:300],
            self.database,
        )
        with self._lock:
            self._counters["dead_lettered"] += 1
        self._accept("x", dead_letter_row(table, "", error, raw), "")

    def _dead_letter(self, table: str, record: object, ex: Exception) -> None:
        run_id = getattr(record, "run_id", "?")
        error = f"{type(ex).__name__}: {ex}"
        log.error(
            "store: %s record for run %.80r is not storable (%s); quarantined in %s.dead_letter",
            table,
            run_id,
            " ".join(error.split())[:300],
            self.database,
        )
        try:
            raw = repr(record)
        except Exception:  # a repr that raises must not lose the record's existence
            raw = f"<unprintable {type(record).__name__} run_id={run_id!r}>"
        with self._lock:
            self._counters["dead_lettered"] += 1
        self._accept("x", dead_letter_row(table, "", error, raw), "")

    def _accept(self, kind: str, row: str, key: str, *, durable: bool = False) -> None:
        """``durable``: the caller acknowledges the record on return (a run record), so a
        record that did not reach the WAL raises RecordNotDurable instead of being kept in
        memory only. Other records (decisions, dead letters) are kept in memory then."""
        try:
            self._accept_locked(kind, row, key, durable)
        except RecordNotDurable:
            if durable:
                raise
        except Exception as ex:  # the contract: never raise into the guard
            log.exception("store: accepting a %s record failed", kind)
            if durable:  # whatever went wrong, the record may not be in the WAL
                raise RecordNotDurable(f"accepting the record failed: {ex}") from ex

    def _accept_locked(self, kind: str, row: str, key: str, durable: bool) -> None:
        w = self._writer
        with self._lock:
            if self._closed:
                if durable:
                    raise RecordNotDurable("the store is closed")
                self._counters["dropped"] += 1
                log.error("store: DROPPED a %s record written after close()", kind)
                return
            disk = self.disk
            if w.held_rows >= self._max_held:
                # Acknowledged records wait in memory for space: taking more would grow that
                # without bound, and dropping the oldest would lose acknowledged records.
                if durable:
                    disk.refused += 1
                    raise RecordNotDurable(
                        f"{w.held_rows} acknowledged records held in memory (max "
                        f"{self._max_held}) until the data dir can be written again"
                    )
                self._counters["dropped"] += 1
                return  # a decision: nobody acknowledged it (counted, the episode is logged)
            seq = self._seq + 1
            wal_ok = True
            try:
                self._wal.append_record(seq, kind, row)
            except OSError as ex:
                disk.failed("WAL append", ex)
                if durable:
                    disk.refused += 1
                    raise RecordNotDurable(f"WAL append failed: {ex}") from ex
                wal_ok = False
            else:
                if disk.full and not w.held_rows:  # the WAL takes records again: recovered
                    disk.cleared()
            self._seq = seq  # only now: a refused record leaves no gap in the sequence
            q = self._q
            if len(q) < self._max_queue:
                q.append((seq, kind, row, key))
            elif wal_ok:
                w.overflow = True  # the writer reads it back from the WAL
            else:
                self._counters["dropped"] += 1
                log.error("store: DROPPED a %s record: queue full and WAL unwritable", kind)
            w.last_seq = seq
            w.caught_up = False
            self._counters["queued"] += 1
            if w.idle.is_set():  # the writer sets it under this lock: no set is missed
                w.idle.clear()
            full = len(q) >= w.batch_rows
        if full and not w.wake.is_set():  # a set wake is seen: the writer clears it, then drains
            w.wake.set()

    # -- control --------------------------------------------------------------------------

    def counters(self) -> dict[str, int]:
        """queued, written, spooled, replayed, dropped, dead_lettered, deduplicated, pending;
        with record claims (``redis_url``) also records_claimed_elsewhere (dropped: another
        replica holds them), records_unclaimed (stored while Redis was unreachable) and
        records_claim_conflicts (of those, the ones another replica stored too).

        The disk condition: disk_full (1 while the data dir cannot be written, or records
        wait in memory for it), held (acknowledged records kept in memory because neither
        ClickHouse nor the spool took them), refused (run records not acknowledged because
        they could not be made durable) and disk_full_episodes."""
        with self._lock:
            out = dict(self._counters)
            out["pending"] = len(self._q)
            out["disk_full"] = int(self.disk.full)
            out["held"] = self._writer.held_rows
            out["refused"] = self.disk.refused
            out["disk_full_episodes"] = self.disk.episodes
        return out

    @property
    def disk_full(self) -> bool:
        """True while the data dir cannot be written or acknowledged records wait in memory
        for it: new run records are refused (not acknowledged) meanwhile, unless the WAL
        takes them."""
        return self.disk.full

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything accepted so far is in ClickHouse. False on timeout."""
        return self._wait(timeout_s, durable_ok=False)

    def _wait(self, timeout_s: float, *, durable_ok: bool) -> bool:
        # durable_ok (close): also stop waiting once every record is at least in the spool
        # and ClickHouse has refused a replay since we started: waiting longer buys nothing.
        start = time.monotonic()
        deadline = start + timeout_s
        w = self._writer
        w.retry_now()
        w.idle.clear()
        w.wake.set()
        while time.monotonic() < deadline:
            if w.idle.wait(min(0.05, max(0.0, deadline - time.monotonic()))):
                return True
            if not w.is_alive():
                return False
            if durable_ok and w.caught_up and w.failed_at > start:
                return False
            if durable_ok and w.held_rows and w.held_failed_at > start:
                return False  # the disk refused the held records again: they stay in the WAL
            w.wake.set()
        return False

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush, stop the writer and release the data dir. Idempotent."""
        if self._closed:
            return
        ok = self._wait(timeout_s, durable_ok=True)
        with self._lock:
            self._closed = True
        self._writer.stopping = True
        self._writer.wake.set()
        self._writer.join(max(0.1, timeout_s))
        with self._lock:
            # Every record in ClickHouse or the spool -> the WAL is no longer needed;
            # otherwise it stays and the next open recovers it.
            self._wal.close(delete=self._writer.caught_up and not self._writer.is_alive())
        if not ok:
            log.warning(
                "store: closed with records not yet in ClickHouse (kept on disk, replayed at "
                "the next start): %s",
                self.counters(),
            )
        for client in (self._writer.client, self._read_client):
            if client is not None and not self._writer.is_alive():
                with contextlib.suppress(Exception):  # closing is best effort
                    client.close()
        self._spool.close()
        if self.claims is not None and not self._writer.is_alive():
            self.claims.close()
        self._release()

    def _release(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- read path ------------------------------------------------------------------------

    def report(self, **query: Unpack[ReportQuery]) -> Report:
        """Stop-reason distribution and time series from ``stop_reasons_1m`` (the keywords
        of :func:`~guard.store._reporting.query_report`)."""
        try:
            with self._read_lock:
                return query_report(self._reader_locked(), self.database, **query)
        except Exception as ex:
            raise StoreError(f"report from {self.dsn.redacted()} failed: {ex}") from ex

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> list[tuple]:
        """Run a read query on the store's engine (tests, dashboards checks, the demo)."""
        with self._read_lock:
            return self._reader_locked().query(sql, parameters=parameters).result_rows

    def _reader_locked(self) -> Any:
        """The read path's client, connected on first use (under ``_read_lock``)."""
        if self._read_client is None:
            self._read_client = connect(self.dsn)
        return self._read_client
