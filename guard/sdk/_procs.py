"""Killing the subprocess groups a run registered: SIGTERM now, SIGKILL after a grace period.

A process started with ``start_new_session=True`` (or ``process_group=0``) leads its own
process group, so the whole tree (``sh -c "sleep 60 & ..."``) is signalled. A process that
shares our group is signalled alone: killing our own group would kill the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from typing import Any

from guard.sdk import _timers

__all__ = ["TrackedProcess", "safe_call"]

log = logging.getLogger("guard.sdk")


class TrackedProcess:
    """A process (``subprocess.Popen``, ``asyncio.subprocess.Process`` or a pid) of a run."""

    __slots__ = ("pgid", "pid", "proc")

    def __init__(self, proc: Any) -> None:
        self.proc = proc
        self.pid: int = proc if isinstance(proc, int) else int(proc.pid)
        try:
            pgid = os.getpgid(self.pid)
        except (ProcessLookupError, PermissionError, OSError):
            pgid = None
        # Record the group now: once the leader exits, getpgid() no longer works, but the
        # group's other members may still be running.
        self.pgid = pgid if pgid is not None and pgid != os.getpgrp() else None

    def alive(self) -> bool:
        if isinstance(self.proc, int):
            try:
                os.kill(self.pid, 0)
            except OSError:
                return False
            return True
        poll = getattr(self.proc, "poll", None)
        if poll is not None:
            return poll() is None
        return getattr(self.proc, "returncode", None) is None

    def _signal(self, sig: int) -> None:
        try:
            if self.pgid is not None:
                os.killpg(self.pgid, sig)
            else:
                os.kill(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        except OSError:
            log.debug("signal %s to %s failed", sig, self.pid, exc_info=True)

    def terminate(self, grace_s: float) -> None:
        """SIGTERM the group now; SIGKILL it after ``grace_s`` if anything is left."""
        if self.pgid is None and not self.alive():
            return
        self._signal(signal.SIGTERM)
        _timers.schedule(grace_s, self._escalate)

    def _escalate(self) -> None:
        if self.pgid is not None:
            self._signal(signal.SIGKILL)  # the leader may be gone while members are not
        elif self.alive():
            self._signal(signal.SIGKILL)
        # Reap a Popen so the killed child does not linger as a zombie.
        poll = getattr(self.proc, "poll", None)
        if poll is not None:
            with contextlib.suppress(Exception):
                poll()


def safe_call(fn: Callable[..., Any], *args: Any) -> None:
    """Run a user callback (on_cancel / on_directive); its errors never break a cancel."""
    try:
        res = fn(*args)
        if asyncio.iscoroutine(res):
            res.close()  # callbacks must be synchronous; never leave a coroutine unawaited
            log.warning("otel-guard: on_cancel/on_directive callbacks must be synchronous")
    except Exception:
        log.exception("otel-guard: callback failed")
