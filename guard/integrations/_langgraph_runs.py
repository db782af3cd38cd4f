"""Graph runs as guarded runs: ``Pregel.stream`` / ``astream`` (``invoke`` / ``ainvoke`` too).

A LangGraph run is an iterator the caller drives, so :func:`guard.integrations._base.in_run`
(which calls a function) cannot hold it: here the same contract is kept for iterators.

* Inside a live ``@guard.run`` the graph attaches to it; the step inferred inside it is closed
  when the graph run ends, and a stop the graph swallowed is raised again at its end.
* Outside one, the graph run is a run of its own, named after the graph, that lives while the
  iterator is driven: it starts at the first ``next()``, ends when the iterator is exhausted,
  raises or is closed (a caller that stops reading early ends it as completed), and its
  stop comes out of the iterator as ``guard.RunStopped`` with the run's final outcome.
* A graph run inside a graph run of the same guard run (a subgraph) is left alone.

The run is started and finished with the SDK's own ``@guard.run`` lifecycle
(:mod:`guard.sdk._decorator`), so admission, the run span and the termination record are the
same as a decorated function's.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from guard.errors import RunStopped
from guard.integrations._base import _swallowed, active_run, end_inferred_step
from guard.sdk import _decorator as D
from guard.sdk._config import get_settings

__all__ = ["aiter_in_run", "iter_in_run", "wrap_graph_astream", "wrap_graph_stream"]

# The guard run the current (outermost) graph run is driving: a nested graph is left alone.
_graph_of: contextvars.ContextVar[Any] = contextvars.ContextVar("otel_guard_graph", default=None)

_specs: dict[str, D.RunSpec] = {}


def _spec(agent: str) -> D.RunSpec:
    spec = _specs.get(agent)
    if spec is None:
        spec = D.run(agent=agent)(lambda: None).__guard_spec__
        if len(_specs) < 256:  # graph names are code, not data; bounded all the same
            _specs[agent] = spec
    return spec


def _reset(var: contextvars.ContextVar[Any], token: Any) -> None:
    with contextlib.suppress(ValueError):  # finalised in another context (closed by the GC)
        var.reset(token)


# -- sync ----------------------------------------------------------------------------------------
def _attached(run: Any, it: Iterator[Any]) -> Iterator[Any]:
    token = _graph_of.set(run)
    try:
        yield from it
    except (RunStopped, GeneratorExit):
        raise
    except BaseException as exc:
        _swallowed(run, exc)
        raise
    finally:
        end_inferred_step(run)
        _reset(_graph_of, token)
    _swallowed(run, None)


def iter_in_run(agent: str, make: Callable[[], Iterator[Any]]) -> Iterator[Any]:
    """Drive the iterator ``make()`` attached to the active run, or as a new run ``agent``."""
    run = active_run()
    if run is not None:
        yield from make() if _graph_of.get() is run else _attached(run, make())
        return
    if get_settings().disabled:
        yield from make()
        return
    spec = _spec(agent)
    r, token, otel_token = D._start(spec, False)
    graph_token = _graph_of.set(r)
    try:
        D._admit_blocking(r, spec)
        yield from make()
    except GeneratorExit:  # the caller stopped reading: the run ends as it stands
        _reset(_graph_of, graph_token)
        D._finish(r, token, otel_token, None)
        raise
    except BaseException as exc:
        _reset(_graph_of, graph_token)
        outcome, stopped = D._finish(r, token, otel_token, exc)
        if stopped:
            D._raise_for(outcome, exc)
        raise
    _reset(_graph_of, graph_token)
    outcome, stopped = D._finish(r, token, otel_token, None)
    if stopped and r.stopped is None:
        raise RunStopped(outcome)


# -- async ---------------------------------------------------------------------------------------
async def _aattached(run: Any, it: AsyncIterator[Any]) -> AsyncIterator[Any]:
    token = _graph_of.set(run)
    try:
        async for item in it:
            yield item
    except (RunStopped, GeneratorExit):
        raise
    except BaseException as exc:
        _swallowed(run, exc)
        raise
    finally:
        end_inferred_step(run)
        _reset(_graph_of, token)
    _swallowed(run, None)


async def aiter_in_run(agent: str, make: Callable[[], AsyncIterator[Any]]) -> AsyncIterator[Any]:
    """:func:`iter_in_run` for an async iterator; a cancel cancels the task driving it."""
    run = active_run()
    if run is not None:
        it = make() if _graph_of.get() is run else _aattached(run, make())
        async for item in it:
            yield item
        return
    if get_settings().disabled:
        async for item in make():
            yield item
        return
    spec = _spec(agent)
    r, token, otel_token = D._start(spec, True)
    r.task = asyncio.current_task()
    r.loop = asyncio.get_running_loop()
    if r.cancelled:
        r._cancel_task()
    graph_token = _graph_of.set(r)
    try:
        await D._admit_awaiting(r, spec)
        async for item in make():
            yield item
    except GeneratorExit:
        _reset(_graph_of, graph_token)
        r.consume_task_cancel()
        D._finish(r, token, otel_token, None)
        raise
    except BaseException as exc:
        _reset(_graph_of, graph_token)
        r.consume_task_cancel()
        outcome, stopped = D._finish(r, token, otel_token, exc)
        task = r.task
        outer = isinstance(exc, asyncio.CancelledError) and task is not None and task.cancelling()
        if stopped and not outer:
            D._raise_for(outcome, exc)
        raise
    _reset(_graph_of, graph_token)
    r.consume_task_cancel()
    outcome, stopped = D._finish(r, token, otel_token, None)
    if stopped and r.stopped is None:
        raise RunStopped(outcome)


# -- the Pregel wrappers ---------------------------------------------------------------------------
def _agent(graph: Any) -> str:
    name = getattr(graph, "name", None)
    return name if isinstance(name, str) and name else "LangGraph"


def wrap_graph_stream(orig: Callable[..., Any], *, bubble: Callable[[RunStopped], Any]) -> Any:
    """``Pregel.stream`` driven by :func:`iter_in_run`."""

    @functools.wraps(orig)
    def stream(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        make = functools.partial(orig, self, *args, **kwargs)
        return _bubbling(iter_in_run(_agent(self), make), bubble)

    return stream


def wrap_graph_astream(orig: Callable[..., Any], *, bubble: Callable[[RunStopped], Any]) -> Any:
    """``Pregel.astream`` driven by :func:`aiter_in_run`."""

    @functools.wraps(orig)
    def astream(self: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        make = functools.partial(orig, self, *args, **kwargs)
        return _abubbling(aiter_in_run(_agent(self), make), bubble)

    return astream


def _bubbling(it: Iterator[Any], bubble: Callable[[RunStopped], Any]) -> Iterator[Any]:
    # A graph run inside a node (a subgraph, a graph called by a tool) stops its parent too.
    try:
        yield from it
    except RunStopped as stop:
        raise bubble(stop) from stop.__cause__


async def _abubbling(it: AsyncIterator[Any], bubble: Callable[[RunStopped], Any]) -> Any:
    try:
        async for item in it:
            yield item
    except RunStopped as stop:
        raise bubble(stop) from stop.__cause__
