"""``_enginelog.forget_uncommitted_blocks``: which dedup-log entries it forgets, and when it
leaves the engine's files alone. (The crash itself: ``test_crash.py``.)"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from guard.store._enginelog import forget_uncommitted_blocks

_LOG = (
    b"1\t20261201_1_1_1\t20261201_11_12\n"  # its part exists
    b"1\t20261201_2_2_1\t20261201_21_22\n"  # never committed: killed before the rename
    b"1\t20261201_3_3_1\t20261201_31_32\n"  # merged into 20261201_3_4_2
    b"1\t20261130_2_2_1\t20261130_41_42\n"  # same blocks, other partition: no part
    b"2\t20261201_1_1_1\t20261201_11_12\n"  # a DROP record is the engine's own
)


def _engine(tmp_path: Path, log: bytes = _LOG) -> tuple[Path, Path]:
    engine = tmp_path / "clickhouse"
    table = engine / "store" / "abc" / "abc-uuid"
    for part in ("20261201_1_1_1", "20261201_3_4_2", "tmp_insert_20261201_2_2_1", "detached"):
        (table / part).mkdir(parents=True)
    (table / "detached" / "20261130_2_2_1").mkdir()  # a detached part is not committed
    (table / "deduplication_logs").mkdir()
    path = table / "deduplication_logs" / "deduplication_log_1.txt"
    path.write_bytes(log)
    (engine / "data" / "otel_guard").mkdir(parents=True)
    (engine / "data" / "otel_guard" / "runs").symlink_to(table)
    (engine / "status").write_text("PID: 1\n")  # left behind by a killed engine
    return engine, path


def test_forgets_only_entries_no_part_covers(tmp_path: Path) -> None:
    engine, path = _engine(tmp_path)
    assert forget_uncommitted_blocks(engine) == 2
    lines = _LOG.splitlines(keepends=True)
    assert path.read_bytes() == lines[0] + lines[2] + lines[4]
    assert forget_uncommitted_blocks(engine) == 0  # idempotent
    assert list((engine / "tmp").iterdir()) == []  # no stray file left


def test_a_torn_last_line_is_kept(tmp_path: Path) -> None:
    engine, path = _engine(tmp_path, _LOG + b"1\t20261201_5_5_1\t2026")
    assert forget_uncommitted_blocks(engine) == 2
    assert path.read_bytes().endswith(b"\n1\t20261201_5_5_1\t2026")


def test_leaves_the_files_alone_when_it_cannot_be_sure(tmp_path: Path) -> None:
    engine, path = _engine(tmp_path, _LOG + b"3\tsomething new\n")
    assert forget_uncommitted_blocks(engine) == 0  # a format it does not know
    assert path.read_bytes() == _LOG + b"3\tsomething new\n"

    engine, path = _engine(tmp_path / "live")
    fd = os.open(engine / "status", os.O_RDONLY)  # an engine runs on the directory
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert forget_uncommitted_blocks(engine) == 0
    finally:
        os.close(fd)
    assert path.read_bytes() == _LOG

    (engine / "status").unlink()  # the engine shut down cleanly: nothing can be orphaned
    assert forget_uncommitted_blocks(engine) == 0
    assert path.read_bytes() == _LOG


def test_an_unreadable_log_is_logged_and_skipped(tmp_path: Path, caplog) -> None:
    engine, path = _engine(tmp_path)
    path.unlink()
    path.mkdir()  # reading it raises IsADirectoryError: the store must still open
    assert forget_uncommitted_blocks(engine) == 0
    assert "could not check the deduplication log of otel_guard.runs" in caplog.text
