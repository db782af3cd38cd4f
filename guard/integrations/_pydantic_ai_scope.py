"""A run scope as an async context manager, for framework runs that are context managers.

:func:`guard.integrations._base.in_run_async` guards a framework run that is one coroutine.
Pydantic AI's runs are ``async with`` blocks (``agent.iter()``, ``agent.run_stream()``; ``run``
and ``run_sync`` use ``iter`` underneath), whose body is the caller's own code, so the run is
opened on enter and closed on exit here, with the same semantics as ``@guard.run`` on an async
function: attached to the active run when there is one, else a new run named after the agent,
driven by the current task (a cancel cancels that task and comes out as ``RunStopped``).

This belongs in the base (a context-manager form of ``in_run_async``); it lives here until then.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator

from guard.errors import RunStopped
from guard.integrations._base import _swallowed, active_run, end_inferred_step
from guard.sdk._config import get_settings
from guard.sdk._decorator import (
    RunSpec,
    _admit_awaiting,
    _finish,
    _make_spec,
    _raise_for,
    _start,
)
from guard.sdk._run import Run

__all__ = ["run_scope"]


@functools.lru_cache(maxsize=256)
def _spec(agent: str) -> RunSpec:
    """The spec of a framework run: the agent's name, the policy's limits (none of its own)."""
    return _make_spec(agent, None, None, {}, None, None, (), None)


@contextlib.asynccontextmanager
async def run_scope(agent: str) -> AsyncIterator[Run | None]:
    """Guard the ``async with`` body as the active run, or as a new run ``agent``.

    Yields the run (``None`` when the guard is disabled). A stop the framework caught and
    turned into something else is raised again as ``RunStopped`` on exit.
    """
    run = active_run()
    if run is not None:
        try:
            yield run
        except RunStopped:
            raise
        except BaseException as exc:
            _swallowed(run, exc)
            raise
        finally:
            end_inferred_step(run)
        _swallowed(run, None)
        return
    if get_settings().disabled:
        yield None
        return
    async with _new_run(_spec(agent)) as run:
        yield run


@contextlib.asynccontextmanager
async def _new_run(spec: RunSpec) -> AsyncIterator[Run]:
    # The async-with form of guard.sdk._decorator._run_async (same steps, same order).
    r, token, otel_token = _start(spec, True)
    r.task = asyncio.current_task()
    r.loop = asyncio.get_running_loop()
    if r.cancelled:
        r._cancel_task()
    try:
        await _admit_awaiting(r, spec)
        yield r
    except BaseException as exc:
        r.consume_task_cancel()
        outcome, stopped = _finish(r, token, otel_token, exc)
        task = r.task
        outer = (
            isinstance(exc, asyncio.CancelledError) and task is not None and task.cancelling() > 0
        )
        if stopped and not outer:
            _raise_for(outcome, exc)
        raise
    r.consume_task_cancel()
    outcome, stopped = _finish(r, token, otel_token, None)
    if stopped and r.stopped is None:
        raise RunStopped(outcome)
