"""A run scope as an async context manager, for framework runs that are context managers.

:func:`guard.integrations._base.in_run_async` guards a framework run that is one coroutine.
Pydantic AI's runs are ``async with`` blocks (``agent.iter()``, ``agent.run_stream()``; ``run``
and ``run_sync`` use ``iter`` underneath), whose body is the caller's own code, so the run is
opened on enter and closed on exit here, with the SDK's run scope (:mod:`guard.sdk._scope`, the
same lifecycle as ``@guard.run`` on an async function): attached to the active run when there
is one, else a new run named after the agent, driven by the current task (a cancel cancels
that task and comes out as ``RunStopped``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from guard.integrations._base import _framework_run, active_run
from guard.sdk._config import get_settings
from guard.sdk._decorator import agent_spec
from guard.sdk._run import LiveRun
from guard.sdk._scope import RunScope

__all__ = ["run_scope"]


@contextlib.asynccontextmanager
async def run_scope(agent: str) -> AsyncIterator[LiveRun | None]:
    """Guard the ``async with`` body as the active run, or as a new run ``agent``.

    Yields the run (``None`` when the guard is disabled). A stop the framework caught and
    turned into something else is raised again as ``RunStopped`` on exit.
    """
    run = active_run()
    if run is not None:
        with _framework_run(run):
            yield run
        return
    if get_settings().disabled:
        yield None
        return
    async with RunScope(agent_spec(agent)) as run:
        yield run
