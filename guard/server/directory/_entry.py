"""A run's entry in the shared run directory (``P:run:<run_id>``, see
:mod:`guard.server.directory._redis`) as another replica reads it."""

from __future__ import annotations

import base64
import contextlib
from dataclasses import dataclass
from typing import Any

from guard.v1 import guard_pb2 as pb
from guard.wire import limits_from_pb

__all__ = ["DirEntry"]


@dataclass(frozen=True, slots=True)
class DirEntry:
    """One run's directory entry as another replica reads it."""

    replica: str
    ended: bool
    tenant: str
    agent: str
    parent_run_id: str
    process_id: str
    limits: Any  # guard.policy.Limits, or None when the entry carried none

    @classmethod
    def parse(cls, h: dict[str, str]) -> DirEntry | None:
        if not h or "r" not in h:
            return None
        limits = None
        if h.get("l"):
            with contextlib.suppress(Exception):  # a malformed entry: the local defaults
                limits = limits_from_pb(pb.Limits.FromString(base64.b64decode(h["l"])))
        return cls(
            replica=h["r"],
            ended=h.get("s") == "e",
            tenant=h.get("t", ""),
            agent=h.get("a", ""),
            parent_run_id=h.get("p", ""),
            process_id=h.get("pid", ""),
            limits=limits,
        )
