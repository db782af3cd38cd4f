"""The store's "cannot write its data dir" condition (disk full, or any OSError on a write).

While it lasts, :meth:`Store.write_run` refuses run records whose WAL append failed
(:class:`RecordNotDurable`: the guard does not acknowledge them, the agent keeps them), and
the writer keeps in memory the batches it could neither insert nor spool. It is reported
once when it starts (WARNING) and once when it clears (INFO), never once per record: a full
disk fails every write, and a line per record would fill whatever disk the log is on too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

from guard.errors import StoreError
from guard.store._backoff import Backoff

__all__ = ["DiskState", "RecordNotDurable", "probe_writable"]

log = logging.getLogger("guard.store")

_PROBE_BYTES = 64 << 10  # a few WAL records' worth: a disk that takes this takes a batch line
_PROBE_MIN_S = 0.25
_PROBE_MAX_S = 5.0  # short: the guard is refusing records until the probe succeeds


class RecordNotDurable(StoreError):
    """The record was NOT written to the WAL (disk full, I/O error, or too many records
    already held in memory): the caller must not acknowledge it, and must offer it again
    later (the agent's SDK resends it; the guard retries its own records)."""


class DiskState:
    """Whether the data dir can be written, with a jittered backoff for the writer's probe.

    Not locked: the store and the writer call it under the store's lock.
    """

    def __init__(self) -> None:
        self.full = False
        self.since = 0.0  # monotonic start of the current episode
        self.reason = ""
        self.refused = 0  # run records refused (not acknowledged) since the store opened
        self.episodes = 0
        self._refused_before = 0
        self._retry = Backoff(min_s=_PROBE_MIN_S, max_s=_PROBE_MAX_S)

    def failed(self, what: str, ex: BaseException) -> None:
        """A write to the data dir failed: start an episode (one WARNING line, the first
        probe scheduled) if none is running."""
        if not self.full:
            self.full = True
            self.since = time.monotonic()
            self.reason = f"{what}: {ex}"
            self.episodes += 1
            self._refused_before = self.refused
            self._retry.reset()
            log.warning(
                "store: cannot write the data dir (%s): disk full or failing. New run records "
                "are not acknowledged (agents keep and resend them); records already "
                "acknowledged are kept in memory and written once space returns",
                self.reason,
            )
            self.backoff()  # later failures leave the schedule alone: the writer backs off

    def backoff(self) -> None:
        """Schedule the next retry or probe: from 0.25 s to 5 s, jittered (:class:`Backoff`)."""
        self._retry.failed()

    def due(self) -> bool:
        return self._retry.due()

    def cleared(self, held_written: int = 0) -> None:
        """Writes succeed again and nothing is held in memory: end the episode (one INFO
        line)."""
        if self.full:
            self.full = False
            self._retry.reset()
            self._retry.retry_now()
            log.info(
                "store: the data dir is writable again after %.1fs (%d held records written, "
                "%d run records refused meanwhile); acknowledging records again",
                time.monotonic() - self.since,
                held_written,
                self.refused - self._refused_before,
            )


def probe_writable(directory: Path) -> OSError | None:
    """Write (and fsync, then delete) a small file in ``directory``; the error, or None
    when the disk took it."""
    path = directory / "space.probe"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            data = b"\0" * _PROBE_BYTES
            if os.write(fd, data) != len(data):
                raise OSError(28, "short probe write")
            os.fsync(fd)
        finally:
            os.close(fd)
        return None
    except OSError as ex:
        return ex
    finally:
        with contextlib.suppress(OSError):  # the next probe overwrites it anyway
            path.unlink(missing_ok=True)
