"""After the embedded engine was killed: forget insert-deduplication entries of parts it never committed.

Why: ClickHouse's non-replicated insert deduplication (``non_replicated_deduplication_window``)
appends a new part's block id to the table's ``deduplication_logs/`` *before* it renames the
part from ``tmp_insert_…`` to its final name (``MergeTreeData::renameTempPartAndReplace``;
seen with strace: the log ``write`` comes ~0.1 ms before the ``rename``). With chDB the engine
runs inside the guard, so a SIGKILL of the guard in that window leaves a block id on disk whose
part is gone: the next engine deletes the ``tmp_insert_`` directory, loads the log, and takes
the writer's WAL replay of that batch, under its original token, for a duplicate. The batch is
lost without an error (``runs``, ``decisions`` or ``stop_reasons_1m``: each table has its own
window). ``tests/store/test_crash.py`` rebuilds that state on disk, and strace with a delayed
``rename`` reproduced it in 6 trials of 6.

So before the engine starts, every log line that names a part no directory of the table covers
is removed. A line whose part exists (or was merged into one that exists) is kept, so a batch that
did commit is still dropped as a duplicate when it is replayed, and a view part that the crash
cut off is still completed by the replay (the operations guide: "No record lost, none counted twice").

This reads the engine's private files, so it is conservative: it runs only when the engine did
not shut down cleanly (its ``status`` file, which a clean shutdown removes, is still there) and
nothing holds that file's lock (the engine keeps it locked while it runs); a file with a line of
an unknown format is left untouched (with a WARNING: the replay then behaves as before).
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
from pathlib import Path

__all__ = ["forget_uncommitted_blocks"]

log = logging.getLogger("guard.store")

# {partition id}_{min block}_{max block}_{level}[_{mutation}]; partition ids hold no "_".
_PART = re.compile(r"([^_/]+)_(\d+)_(\d+)_(\d+)(?:_\d+)?")
_ADD = "1"  # MergeTreeDeduplicationOp::ADD; DROP lines ("2") are kept as they are


def forget_uncommitted_blocks(engine_dir: Path) -> int:
    """Remove the dedup-log entries of parts that were never committed. Returns how many.

    Call before the embedded engine at ``engine_dir`` starts. Does nothing (returns 0) after a
    clean shutdown, or when an engine runs on the directory now.
    """
    status = engine_dir / "status"
    try:
        fd = os.open(status, os.O_RDONLY)
    except FileNotFoundError:  # clean shutdown (or a new directory): nothing can be orphaned
        return 0
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # an engine runs on this directory: its logs are its own business
            return 0
        try:
            # data/{db}/{table} links to store/xxx/{uuid} (Atomic) or is the table (Ordinary)
            names = {p.resolve(): f"{p.parent.name}.{p.name}" for p in engine_dir.glob("data/*/*")}
            tables = {p.parent.resolve() for p in engine_dir.glob("*/*/*/deduplication_logs")}
            return sum(_forget_safely(t, names.get(t, t.name), engine_dir) for t in sorted(tables))
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _forget_safely(table_dir: Path, table: str, engine_dir: Path) -> int:
    try:
        return _forget_in_table(table_dir, table, engine_dir / "tmp")
    except OSError as ex:  # never keep the guard from starting: the replay works as before
        log.warning("store: could not check the deduplication log of %s (%s)", table, ex)
        return 0


def _forget_in_table(table_dir: Path, table: str, tmp_dir: Path) -> int:
    parts: dict[str, list[tuple[int, int]]] = {}
    for entry in table_dir.iterdir():
        m = _PART.fullmatch(entry.name)
        if m and entry.is_dir():  # tmp_*, detached/ and delete_tmp_* never match
            parts.setdefault(m[1], []).append((int(m[2]), int(m[3])))
    removed = 0
    for log_file in sorted((table_dir / "deduplication_logs").glob("deduplication_log_*.txt")):
        kept, gone = _orphans(log_file, parts)
        if kept is None or not gone:
            continue
        _replace(log_file, kept, tmp_dir)
        removed += len(gone)
        log.warning(
            "store: the embedded ClickHouse was killed while committing to %s: forgot the "
            "insert-deduplication entries of %d parts it never committed (%s), so their "
            "batches are replayed from the WAL instead of being taken for duplicates",
            table,
            len(gone),
            ", ".join(gone[:4]),
        )
    return removed


def _orphans(
    log_file: Path, parts: dict[str, list[tuple[int, int]]]
) -> tuple[bytes | None, list[str]]:
    """(the log's bytes without orphaned ADD lines, their part names); (None, []) when a line
    has a format this module does not know."""
    data = log_file.read_bytes()
    kept: list[bytes] = []
    gone: list[str] = []
    *lines, tail = data.split(b"\n")
    for line in lines:
        fields = line.decode("utf-8", "replace").split("\t")
        m = _PART.fullmatch(fields[1]) if len(fields) == 3 else None
        if m is None or fields[0] not in (_ADD, "2"):
            log.warning("store: unknown line in %s; left as it is", log_file)
            return None, []
        lo, hi = int(m[2]), int(m[3])
        if fields[0] == _ADD and not any(a <= lo and hi <= b for a, b in parts.get(m[1], ())):
            gone.append(fields[1])
        else:
            kept.append(line + b"\n")
    return b"".join(kept) + tail, gone  # a torn last line (tail) is the engine's to judge


def _replace(path: Path, data: bytes, tmp_dir: Path) -> None:
    # The engine's own tmp dir (same file system, emptied at its start): no stray file is
    # ever left next to the logs, and the rename is atomic.
    tmp_dir.mkdir(exist_ok=True)
    tmp = tmp_dir / f"otel-guard-{path.name}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
