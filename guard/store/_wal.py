"""The writer's two files on disk: the write-ahead log and the spool (JSON lines).

**WAL** (``wal/seg-NNNNNNNN.log``): every accepted record is appended with one ``os.write``
*before* ``write_run`` returns, so it is in the kernel page cache and survives SIGKILL of the
process. Lines::

    {seq}\t{kind}\t{row JSON}       a record (kind "r" = runs, "d" = decisions)
    {"b": [kind, lo, hi, token, excluded, final]}
                                     batch marker: records lo..hi of kind go out with token,
                                     minus the run ids in ``excluded`` (already claimed or
                                     committed) and repeats within the batch (first wins);
                                     ``final``: ClickHouse was checked for these ids right
                                     before the insert, so a replay sends exactly this again
    {"d": hi}                        every batch up to seq hi is committed (ClickHouse or spool)

JSON escapes tabs and newlines inside strings, so neither appears raw in a row. The writer
fsyncs the WAL once per batch (before inserting), so power loss can cost at most one flush
interval of acknowledged records; a process crash costs nothing. Segments rotate at
``segment_bytes`` and are deleted once fully committed. On open, leftovers of a previous
process move to the spool: batches with a marker keep their token (a batch that did reach
ClickHouse before the crash is then dropped by insert deduplication, and a view that missed
it is completed), unmarked records get new batches that are checked against ClickHouse
before they are replayed.

**Spool** (``spool.log`` + ``spool.cursor``): one fsynced line ``{kind}\t{token}\t{rows}\t
{row JSON, space-separated}`` per batch that could not be inserted. Replayed strictly in order
with its original token; the cursor (byte offset) advances after each committed batch; the
file is truncated when drained. Kind ``R`` is a runs batch whose content and token are final
(see the marker); kind ``r`` is checked against ClickHouse before its replay, and that
decision is written to ``spool.inflight`` first, so a crash during the replay repeats the
same insert (same token, same rows) instead of deciding again.
None of these classes lock: the store serialises WAL calls under its own lock.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from guard.errors import StoreError

__all__ = ["Spool", "Wal", "lock_dir", "recover_to_spool"]

log = logging.getLogger("guard.store")

_DUMPS = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode

Record = tuple[int, str, str]  # (seq, kind, row JSON)
Pending = tuple[str, str, list[str], set[str], bool]  # (kind, token, rows, excluded, final)


class Wal:
    """Append-only, segmented write-ahead log of accepted records."""

    def __init__(self, directory: Path, *, epoch: str, segment_bytes: int = 8 << 20) -> None:
        self.dir = directory
        self.epoch = epoch  # written at the top of every segment: see recover()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self._old = sorted(self.dir.glob("seg-*.log"))  # from a previous process
        last = int(self._old[-1].stem[4:]) if self._old else 0
        self._next_index = last + 1
        self._closed: list[tuple[Path, int]] = []  # (segment, max seq in it)
        self._fd = -1
        self._path: Path | None = None
        self._size = 0
        self._max_seq = 0

    # -- recovery -------------------------------------------------------------------------

    def recover(self) -> tuple[list[Pending], list[Record], str]:
        """Read a previous process's segments.

        Returns (uncommitted batches: (kind, token, rows, excluded run ids, final), unbatched
        records, that process's epoch). The epoch makes tokens for the unbatched records
        deterministic (a crash during recovery re-derives the same ones) yet unique across
        process generations.
        """
        records: dict[int, tuple[str, str]] = {}
        batches: list[list[Any]] = []
        done = 0
        epoch = ""
        for path in self._old:
            for item in _read_lines(path):
                if isinstance(item, tuple):
                    records[item[0]] = (item[1], item[2])
                elif "e" in item:
                    epoch = epoch or str(item["e"])
                elif "b" in item:
                    batches.append(list(item["b"]) + [[], False][len(item["b"]) - 4 :])
                elif "d" in item:
                    done = max(done, item["d"])
        pending: list[Pending] = []
        covered = set()
        for kind, lo, hi, token, excluded, final in batches:
            if hi <= done:
                continue
            seqs = [s for s in range(lo, hi + 1) if s in records and records[s][0] == kind]
            covered.update(seqs)
            if seqs:
                rows = [records[s][1] for s in seqs]
                pending.append((kind, token, rows, set(excluded), bool(final)))
        loose = [
            (s, k, row) for s, (k, row) in sorted(records.items()) if s > done and s not in covered
        ]
        return pending, loose, epoch or f"noepoch{self._old[0].stem[4:] if self._old else ''}"

    def drop_old(self) -> None:
        """Delete the previous process's segments (after their content reached the spool)."""
        for path in self._old:
            path.unlink(missing_ok=True)
        self._old = []

    # -- appending ------------------------------------------------------------------------

    def append_record(self, seq: int, kind: str, row: str) -> None:
        self._write(f"{seq}\t{kind}\t{row}\n".encode())
        self._max_seq = seq

    def mark_batch(
        self, kind: str, lo: int, hi: int, token: str, excluded: list[str], final: bool
    ) -> None:
        self._write((_DUMPS({"b": [kind, lo, hi, token, excluded, final]}) + "\n").encode())

    def mark_done(self, hi: int) -> None:
        self._write((_DUMPS({"d": hi}) + "\n").encode())

    def _write(self, data: bytes) -> None:
        if self._fd < 0 or self._size >= self.segment_bytes:
            self._rotate()
        # One write() per line: the kernel has the whole line before we return, so a killed
        # process never leaves a record half-acknowledged.
        n = os.write(self._fd, data)
        if n != len(data):  # short write: disk full
            # Cut the torn tail: the next line appended after it would otherwise be glued to
            # it, and the record in that next line (acknowledged) unreadable on recovery.
            os.ftruncate(self._fd, self._size)
            raise OSError(28, f"short WAL write ({n} of {len(data)} bytes)")
        self._size += n

    def _rotate(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            assert self._path is not None
            self._closed.append((self._path, self._max_seq))
            self._fd = -1
            self._path = None
        path = self.dir / f"seg-{self._next_index:08d}.log"
        self._next_index += 1
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        header = (_DUMPS({"e": self.epoch}) + "\n").encode()
        try:
            if os.write(fd, header) != len(header):
                raise OSError(28, "short WAL header write")
        except OSError:
            # A segment without its header is not kept: the next append opens a fresh one.
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        self._fd, self._path, self._size = fd, path, len(header)

    def fsync(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)

    def retire(self, done_hi: int) -> None:
        """Delete closed segments whose records are all committed."""
        keep = []
        for path, max_seq in self._closed:
            if max_seq <= done_hi:
                path.unlink(missing_ok=True)
            else:
                keep.append((path, max_seq))
        self._closed = keep

    def segments(self) -> list[Path]:
        """This process's segments, oldest first (snapshot; call under the store lock)."""
        return [p for p, _ in self._closed] + ([self._path] if self._path else [])

    @staticmethod
    def read_range(paths: list[Path], lo: int, hi: int) -> list[Record]:
        """Records lo..hi in ``paths`` (the overflow path: they never made it to memory).

        Reads without the store lock: closed segments are immutable, and only the writer
        thread (the caller) ever deletes one.
        """
        out = {}
        for path in paths:
            for item in _read_lines(path):
                if isinstance(item, tuple) and lo <= item[0] <= hi:
                    out[item[0]] = item
        return [out[s] for s in sorted(out)]

    def close(self, *, delete: bool) -> None:
        """Close the current segment; ``delete`` when every record is committed."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            assert self._path is not None
            self._closed.append((self._path, self._max_seq))
        if delete:
            for path, _ in self._closed:
                path.unlink(missing_ok=True)
            self._closed = []


class Spool:
    """Append-only file of batches waiting for ClickHouse, replayed in order."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "spool.log"
        self.cursor_path = directory / "spool.cursor"
        self.inflight_path = directory / "spool.inflight"
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            self._cursor = int(self.cursor_path.read_text() or 0)
        except (OSError, ValueError):
            self._cursor = 0
        self._size = os.fstat(self._fd).st_size
        if self._cursor > self._size:  # crashed between truncate and cursor reset
            self._cursor = 0

    @property
    def pending(self) -> bool:
        return self._cursor < self._size

    def append(self, kind: str, token: str, rows: list[str]) -> None:
        data = _spool_line(kind, token, len(rows), " ".join(rows))
        n = os.write(self._fd, data)
        if n != len(data):
            # Cut the torn tail so the next append starts on a line boundary.
            os.ftruncate(self._fd, self._size)
            raise OSError(28, f"short spool write ({n} of {len(data)} bytes)")
        os.fsync(self._fd)
        self._size += n

    def peek(self, max_batches: int = 8) -> Iterator[tuple[int, str, str, int, str]]:
        """Yield (end offset, kind, token, row count, rows blob) from the cursor on."""
        with open(self.path, "rb") as f:
            f.seek(self._cursor)
            offset = self._cursor
            for _ in range(max_batches):
                line = f.readline()
                if not line:
                    return
                offset += len(line)
                try:
                    kind, token, n, blob = line.decode().rstrip("\n").split("\t", 3)
                    item = (offset, kind, token, int(n), blob)
                except ValueError:
                    item = None
                if item is not None and line.endswith(b"\n"):
                    yield item
                else:
                    log.error(
                        "store spool: skipping an unreadable line at byte %d", offset - len(line)
                    )
                    self.advance(offset)

    def advance(self, offset: int) -> None:
        self._cursor = offset
        if self._cursor >= self._size:
            os.ftruncate(self._fd, 0)
            self._size = self._cursor = 0
        _atomic_write(self.cursor_path, str(self._cursor))

    def decided(self, token: str) -> tuple[str, list[str]] | None:
        """The replay decision written for batch ``token`` before a crash: (token, excluded)."""
        try:
            entry = json.loads(self.inflight_path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(entry, dict) or entry.get("t") != token:
            return None
        return str(entry["f"]), list(entry["x"])

    def decide(self, token: str, final_token: str, excluded: list[str]) -> None:
        """Durably record how batch ``token`` is replayed (before its insert)."""
        _atomic_write(self.inflight_path, _DUMPS({"t": token, "f": final_token, "x": excluded}))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def recover_to_spool(wal: Wal, spool: Spool) -> int:
    """Move a previous process's uncommitted WAL records into the spool, in order. Returns
    how many rows were spooled.

    The writer replays them with their original tokens where a batch had been formed: a
    final runs batch ("R") is re-sent exactly as it went out (same rows, same token); every
    other runs batch ("r") is checked against ClickHouse before its replay.
    """
    pending, loose, old_epoch = wal.recover()
    epoch = f"{old_epoch}-rec"
    n = 0
    for kind, token, rows, excluded, final in pending:
        if kind == "r":  # exactly the rows the writer sent: first per run, minus excluded
            rows = _first_per_run(rows, excluded)
            kind = "R" if final else "r"
        if rows:
            spool.append(kind, token, rows)
            n += len(rows)
    for kind in ("r", "d", "x"):
        recs = [(s, row) for s, k, row in loose if k == kind]
        for i in range(0, len(recs), 10_000):
            chunk = recs[i : i + 10_000]
            rows = [r for _, r in chunk]
            if kind == "r":
                rows = _first_per_run(rows, set())
            spool.append(kind, f"{epoch}-{kind}-{chunk[0][0]}-{chunk[-1][0]}", rows)
            n += len(rows)
    wal.drop_old()
    return n


def _first_per_run(rows: list[str], excluded: set[str]) -> list[str]:
    seen: set[str] = set(excluded)
    kept = []
    for row in rows:
        run_id = json.loads(row)[0]
        if run_id not in seen:
            seen.add(run_id)
            kept.append(row)
    return kept


def lock_dir(path: Path) -> int:
    """Lock the data dir for this process (``flock``; the fd holds it); StoreError names the
    pid of the process that holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        try:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        finally:
            os.close(fd)
        raise StoreError(
            f"store data dir {path.parent.parent} is in use by process {holder}: the embedded "
            "engine allows one process per data dir (ask that guard: otel-guard report "
            "--endpoint HOST:PORT)"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _spool_line(kind: str, token: str, n: int, blob: str) -> bytes:
    return f"{kind}\t{token}\t{n}\t{blob}\n".encode()


def _read_lines(path: Path) -> Iterator[Record | dict[str, Any]]:
    """WAL lines: records as (seq, kind, row JSON) tuples, markers as dicts."""
    try:
        with open(path, "rb") as f:
            for raw in f:
                try:
                    if not raw.endswith(b"\n"):
                        raise ValueError("torn")
                    line = raw.decode().rstrip("\n")
                    if line.startswith("{"):
                        yield json.loads(line)
                    else:
                        seq, kind, row = line.split("\t", 2)
                        yield int(seq), kind, row
                except ValueError:  # a torn last line after power loss
                    log.warning("store WAL %s: skipping an unreadable line", path.name)
    except FileNotFoundError:
        return


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
