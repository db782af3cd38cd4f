"""Framework runs attached to a guard run: which one is the outermost, and the stops they hide.

One guard run can hold framework runs inside framework runs: an agent called as a tool of
another agent, a guardrail that runs its own agent, a subgraph. They share the guard run's
inferred step (:func:`guard.integrations._base.step_for`), so only the outermost one may close
it when it ends: a nested run that closed it would leave the outer run's next tool call to
open a step of its own (a step with no model turn). :func:`outermost` tells which is which,
per context: a framework run started from inside another one (a tool, a task it created)
sees the outer one's context.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from guard.errors import RunStopped
from guard.sdk._run import LiveRun

__all__ = ["outermost", "swallowed"]

# The guard runs whose framework run is active in this context (the outermost one set it).
_active: contextvars.ContextVar[frozenset[LiveRun]] = contextvars.ContextVar(
    "otel_guard_framework_runs", default=frozenset()
)


@contextlib.contextmanager
def outermost(run: LiveRun) -> Iterator[bool]:
    """Around a framework run attached to ``run``: yields whether it is the outermost one of
    ``run`` in this context (it then closes the inferred step when it ends)."""
    active = _active.get()
    if run in active:
        yield False
        return
    token = _active.set(active | {run})
    try:
        yield True
    finally:
        # A framework's stream finalised in another context (closed by the GC) cannot reset
        # it there; that context ends with it.
        with contextlib.suppress(ValueError):
            _active.reset(token)


def swallowed(run: LiveRun, exc: BaseException | None) -> None:
    """Raise ``RunStopped`` for a stop the framework swallowed or wrapped (sticky stops)."""
    if run.stopped is not None or run.cancelled or run.stop_pending:
        try:
            run.check_stop()
        except RunStopped as stop:
            if exc is not None:
                raise stop from exc
            raise
