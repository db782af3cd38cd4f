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
* A graph run that stops at an ``interrupt()`` (human in the loop) marks its guard run
  resumable: the run's record has ``partial_result`` and ``recoverable`` set. The resume is the
  next invocation, a run of its own that counts only its own calls (the history the checkpointer
  resends is not its calls: :mod:`guard.integrations._conversation`).

The run is started and finished with the SDK's run scope, the lifecycle of ``@guard.run``
(:mod:`guard.sdk._scope`), so admission, the run span and the termination record are the
same as a decorated function's.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from guard.errors import RunStopped
from guard.integrations._base import _framework_run, active_run
from guard.sdk._config import get_settings
from guard.sdk._decorator import agent_spec
from guard.sdk._scope import RunScope

__all__ = ["aiter_in_run", "iter_in_run", "wrap_graph_astream", "wrap_graph_stream"]

# The guard run the current (outermost) graph run is driving: a nested graph is left alone.
_graph_of: contextvars.ContextVar[Any] = contextvars.ContextVar("otel_guard_graph", default=None)


def _reset(var: contextvars.ContextVar[Any], token: Any) -> None:
    with contextlib.suppress(ValueError):  # finalised in another context (closed by the GC)
        var.reset(token)


def _interrupted(item: Any) -> bool:
    """Whether a graph stream's item is LangGraph's interrupt (``{"__interrupt__": ...}``,
    alone or as the payload of a ``(mode, payload)`` / ``(namespace, mode, payload)`` item)."""
    if isinstance(item, tuple) and item:
        item = item[-1]
    return isinstance(item, dict) and "__interrupt__" in item


def _note(run: Any, item: Any) -> None:
    # An interrupted graph waits to be resumed: its run ends with a partial result it can
    # resume from (the record says so), not as a finished answer.
    if not run.resumable and _interrupted(item):
        run.resumable = True


# -- sync ----------------------------------------------------------------------------------------
def _attached(run: Any, it: Iterator[Any]) -> Iterator[Any]:
    token = _graph_of.set(run)
    try:
        with _framework_run(run):
            for item in it:
                _note(run, item)
                yield item
    finally:
        _reset(_graph_of, token)


def iter_in_run(agent: str, make: Callable[[], Iterator[Any]]) -> Iterator[Any]:
    """Drive the iterator ``make()`` attached to the active run, or as a new run ``agent``."""
    run = active_run()
    if run is not None:
        yield from make() if _graph_of.get() is run else _attached(run, make())
        return
    if get_settings().disabled:
        yield from make()
        return
    with RunScope(agent_spec(agent)) as r:
        token = _graph_of.set(r)
        try:
            for item in make():
                _note(r, item)
                yield item
        finally:
            _reset(_graph_of, token)


# -- async ---------------------------------------------------------------------------------------
async def _aattached(run: Any, it: AsyncIterator[Any]) -> AsyncIterator[Any]:
    token = _graph_of.set(run)
    try:
        with _framework_run(run):
            async for item in it:
                _note(run, item)
                yield item
    finally:
        _reset(_graph_of, token)


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
    async with RunScope(agent_spec(agent)) as r:
        token = _graph_of.set(r)
        try:
            async for item in make():
                _note(r, item)
                yield item
        finally:
            _reset(_graph_of, token)


# -- the Pregel wrappers ---------------------------------------------------------------------------
def _agent(graph: Any) -> str:
    name = getattr(graph, "name", None)
    return name if isinstance(name, str) and name else "LangGraph"


def _wrap(orig: Callable[..., Any], drive: Callable[[str, Callable[[], Any]], Any]) -> Any:
    """``orig`` (a graph method that returns its run's iterator) as ``drive(agent, make)``:
    the graph's name and the call that makes the iterator."""

    @functools.wraps(orig)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        return drive(_agent(self), functools.partial(orig, self, *args, **kwargs))

    return wrapped


def wrap_graph_stream(orig: Callable[..., Any], *, bubble: Callable[[RunStopped], Any]) -> Any:
    """``Pregel.stream`` driven by :func:`iter_in_run`."""
    return _wrap(orig, lambda agent, make: _bubbling(iter_in_run(agent, make), bubble))


def wrap_graph_astream(orig: Callable[..., Any], *, bubble: Callable[[RunStopped], Any]) -> Any:
    """``Pregel.astream`` driven by :func:`aiter_in_run`."""
    return _wrap(orig, lambda agent, make: _abubbling(aiter_in_run(agent, make), bubble))


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
