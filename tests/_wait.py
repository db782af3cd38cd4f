"""The one way tests wait for something to happen: poll a predicate until it holds, within a
bounded deadline, and fail saying what was awaited and the last value seen.

Tests never sleep-then-assert and never assert on elapsed time: they wait for the event (or
its visible effect) with :func:`wait_until` / :func:`wait_until_async`, and the timeout is
only the bound after which the test gives up. ``tests/conftest.py`` puts ``tests/`` on
``sys.path``, so any test imports this as ``from _wait import wait_until``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["WaitTimeout", "wait_until", "wait_until_async"]

T = TypeVar("T")

_INTERVAL_S = 0.01  # short enough that a test waits little past the event, long enough not to spin
_SHOWN_CHARS = 500  # the last value in the failure message, cut to this


class WaitTimeout(AssertionError):
    """The awaited condition did not hold before the deadline (a test failure)."""


def _cut(text: str) -> str:
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


def _describe(predicate: Callable[..., Any]) -> str:
    """The predicate's source line (a lambda reads as what it waits for), else its repr."""
    try:
        return " ".join(inspect.getsource(predicate).split())
    except (OSError, TypeError):
        return repr(predicate)


def _timed_out(predicate: Any, what: Any, timeout_s: float, last: Any) -> WaitTimeout:
    what = _cut((what() if callable(what) else what) or _describe(predicate))
    return WaitTimeout(
        f"timed out after {timeout_s:g} s waiting for {what}; last value: {_cut(repr(last))}"
    )


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float = 10.0,
    what: str | Callable[[], str] | None = None,
    *,
    interval_s: float = _INTERVAL_S,
) -> T:
    """Call ``predicate()`` until it returns something truthy, and return that value.

    Raises :class:`WaitTimeout` (an ``AssertionError``) after ``timeout_s`` with ``what`` (a
    string, or a callable giving one at the timeout; by default the predicate's source line)
    and the last value the predicate returned. Exceptions from the predicate propagate at once.
    The predicate is always called at least once, and once more at the deadline.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        last = predicate()
        if last:
            return last
        left = deadline - time.monotonic()
        if left <= 0:
            raise _timed_out(predicate, what, timeout_s, last)
        time.sleep(min(interval_s, left))


async def wait_until_async(
    predicate: Callable[[], T | Awaitable[T]],
    timeout_s: float = 10.0,
    what: str | Callable[[], str] | None = None,
    *,
    interval_s: float = _INTERVAL_S,
    wake: asyncio.Event | None = None,
) -> T:
    """:func:`wait_until` on the running event loop: sleeps with ``asyncio.sleep`` so a server
    on the same loop keeps running. ``predicate`` may be a coroutine function (a scrape, an
    RPC): its result is awaited each time. With ``wake``, the predicate is checked again as
    soon as that event is set (a message arrived) instead of on the next tick; the event is
    cleared before each check, so a set between the check and the wait is not lost."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        if wake is not None:
            wake.clear()
        last = predicate()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        left = deadline - loop.time()
        if left <= 0:
            raise _timed_out(predicate, what, timeout_s, last)
        if wake is None:
            await asyncio.sleep(min(interval_s, left))
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), left)
