"""Pydantic AI: every agent run guarded, whichever entry point starts it.

``enable()`` wraps ``Agent.iter``, which every entry point runs through (``agent.run``,
``run_sync``, ``run_stream``, ``run_stream_events``, ``run_stream_sync`` and ``iter`` itself):

* Inside an active ``@guard.run`` the framework's run attaches to it; outside one, it becomes a
  run of its own named after the agent (``Agent(name=...)``, else the name Pydantic AI infers,
  else ``pydantic-ai``). A stop comes out of the entry point as ``guard.RunStopped``, also when
  the framework caught it or turned it into its own ``RunCancelled``.
* The run gets :class:`~guard.integrations._pydantic_ai_guard.GuardCapability`, Pydantic AI's
  own extension point: model requests counted once with usage and response id, reserved and
  stop-checked before they leave (at the ``openai`` client when that integration is on and the
  model calls it, else at the model layer), tool calls admitted and fingerprinted in-process for
  loop detection, a step inferred per model turn when the code opens none, and a cancel that
  stops the framework's run at once.

A model call is counted once with Pydantic AI's own OpenTelemetry instrumentation on as well
(``Agent.instrument_all()``, ``instrument=True``): its spans start under the guarded call, whose
context carries :data:`~guard.integrations._base.COUNTED_KEY`.

Guard-side failures never break the agent: they are logged and counted
(:func:`guard.integrations._base.errors`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

from guard.integrations._base import note_error

__all__ = ["LIBRARY", "NAME", "agent_name", "disable", "enable"]

NAME = "pydantic_ai"
LIBRARY = "pydantic_ai"

_patched: list[tuple[type, str, Any]] = []  # (class, attribute, original)


def agent_name(agent: Any) -> str:
    """The name a framework run is recorded under: the agent's, else ``pydantic-ai``."""
    name = getattr(agent, "name", None)
    return name if isinstance(name, str) and name else "pydantic-ai"


def enable() -> None:
    """Wrap ``Agent.iter`` (idempotent)."""
    if _patched:
        return
    from pydantic_ai import Agent

    orig = Agent.__dict__["iter"]
    Agent.iter = _wrap_iter(orig)
    _patched.append((Agent, "iter", orig))


def disable() -> None:
    """Restore ``Agent.iter``."""
    while _patched:
        cls, attr, orig = _patched.pop()
        setattr(cls, attr, orig)


def _with_capability(kwargs: dict[str, Any]) -> dict[str, Any]:
    from guard.integrations._pydantic_ai_guard import GuardCapability

    caps = kwargs.get("capabilities")
    kwargs["capabilities"] = [*(caps or ()), GuardCapability()]
    return kwargs


def _wrap_iter(orig: Callable[..., Any]) -> Callable[..., Any]:
    from guard.integrations._pydantic_ai_scope import run_scope

    @contextlib.asynccontextmanager
    async def iter(self: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async with run_scope(agent_name(self)) as run:
            if run is not None:
                try:
                    kwargs = _with_capability(kwargs)
                except Exception:  # never break the agent: it runs unguarded (counted)
                    note_error("adding the guard to a pydantic-ai run")
            async with orig(self, *args, **kwargs) as agent_run:
                yield agent_run

    functools.update_wrapper(iter, orig)
    iter.__guard_original__ = orig  # type: ignore[attr-defined]
    return iter
