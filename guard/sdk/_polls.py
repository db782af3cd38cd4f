"""Which tool calls are polls: ``@guard.tool(poll=True)``, ``guard.instrument(polls=[...])``
and the policy's ``loop.poll_tools``.

A poll call is judged by the poll rule (:class:`guard.policy.PollWatch`) in-process, never by
the loop detector's repeat and cycle patterns, and its span carries ``guard.tool.poll`` but no
action fingerprint (so the guard counts it without feeding its own detector).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from guard.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from guard.sdk._run import LiveRun

__all__ = ["clear_polls", "declare_polls", "declared_polls", "is_poll"]

# Tool names declared as polls process-wide (guard.instrument(polls=...)): read on every tool
# call, so a frozenset replaced whole (readers never need the lock).
_declared: frozenset[str] = frozenset()
_lock = threading.Lock()


def declare_polls(names: Iterable[str], path: str = "polls") -> frozenset[str]:
    """Add tool names to the process-wide poll declarations; returns them all.

    A single string is one name. Empty or non-string names are a ``ConfigError``.
    """
    global _declared
    if isinstance(names, str):
        names = (names,)
    try:
        given = tuple(names)
    except TypeError:
        raise ConfigError(
            f"must be a list of tool names, got {type(names).__name__}", path=path
        ) from None
    for i, n in enumerate(given):
        if not isinstance(n, str) or not n.strip():
            raise ConfigError(f"must be a non-empty tool name, got {n!r}", path=f"{path}[{i}]")
    with _lock:
        _declared = _declared | frozenset(given)
        return _declared


def clear_polls() -> None:
    """Forget the process-wide poll declarations (``guard.uninstrument()`` of everything)."""
    global _declared
    with _lock:
        _declared = frozenset()


def declared_polls() -> frozenset[str]:
    """The tool names declared as polls process-wide."""
    return _declared


def is_poll(run: LiveRun, name: str) -> bool:
    """Whether a call of tool ``name`` in ``run`` is a poll by name (declared process-wide, or
    in the run's effective policy, ``loop.poll_tools``)."""
    return name in _declared or name in run.poll_tools
