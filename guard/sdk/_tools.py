"""``@guard.tool`` and parallel tool batches admitted against ``max_tool_calls``."""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from typing import Any, TypeVar, overload

from guard.errors import ConfigError
from guard.policy._reservation import check_money
from guard.sdk._calls import MISSING, reserve_tool
from guard.sdk._implicit import tool_estimate
from guard.sdk._run import LiveRun, current_run_or_none

__all__ = ["ToolBatch", "admit_tools", "run_tools", "tool"]

# The batches live in their own module; re-exported here, where they always were.
from guard.sdk._batch import _PASS_THROUGH, ToolBatch, admit_tools, record_in_step, run_tools

F = TypeVar("F", bound=Callable[..., Any])
_RECORDED = (*_PASS_THROUGH, Exception)  # what a tool call's record notes as its error


def _call_args(sig: inspect.Signature | None, args: tuple, kwargs: dict) -> Any:
    """The call's arguments as a name -> value mapping (only its fingerprint is kept)."""
    if sig is not None:
        try:
            bound = sig.bind(*args, **kwargs)
            return dict(bound.arguments)
        except TypeError:
            pass
    return {"args": list(args), "kwargs": kwargs}


@overload
def tool(
    fn: F,
    *,
    name: str | None = None,
    retries: int = 0,
    cost_usd: float | None = None,
    poll: bool = False,
) -> F: ...
@overload
def tool(
    *,
    name: str | None = None,
    retries: int = 0,
    cost_usd: float | None = None,
    poll: bool = False,
) -> Callable[[F], F]: ...


def tool(
    fn: Any = None,
    *,
    name: str | None = None,
    retries: int = 0,
    cost_usd: float | None = None,
    poll: bool = False,
) -> Any:
    """Record every call of a tool function: fingerprint, result hash, attempts, errors.

    ``@guard.tool`` or ``@guard.tool(name="search", retries=2)``; sync or async. Outside a run
    the function runs untouched. A call is admitted first (cancelled runs and an exhausted
    ``max_tool_calls`` refuse it without running it); ``retries`` re-runs a failing call and
    counts every attempt. An exception is recorded as a tool_error observation and re-raised.
    ``cost_usd``: the price of one call of a paid tool; it is reserved before the call
    (against the run, its ancestors and its tenant: ``RunStopped`` when it cannot be covered)
    and recorded as the call's cost.
    ``poll=True``: the tool is a poll (a job status checked until it changes). Its repeated
    identical calls are not a loop; the same call answering the same result
    ``loop.max_unchanged_polls`` times in a row is (``loop_detected``, ``poll_unchanged``).
    """
    if cost_usd is not None:
        cost_usd = check_money("cost_usd", cost_usd)
    if not isinstance(poll, bool):
        raise ConfigError(f"must be true or false, got {poll!r}", path="tool.poll")
    if fn is None:
        return lambda f: tool(f, name=name, retries=retries, cost_usd=cost_usd, poll=poll)
    tool_name: str = name if name else getattr(fn, "__name__", "tool")
    try:
        sig: inspect.Signature | None = inspect.signature(fn)
    except (TypeError, ValueError):
        sig = None

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            run = current_run_or_none()
            if run is None:
                return await fn(*args, **kwargs)
            call = _ToolCall(run, tool_name, sig, args, kwargs, retries, cost_usd, poll)
            while True:
                call.attempts += 1
                try:
                    value = await fn(*args, **kwargs)
                except _RECORDED as exc:
                    if call.retry(exc):
                        continue
                    raise
                return call.done(value)

        return awrapper

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        run = current_run_or_none()
        if run is None:
            return fn(*args, **kwargs)
        call = _ToolCall(run, tool_name, sig, args, kwargs, retries, cost_usd, poll)
        while True:
            call.attempts += 1
            try:
                value = fn(*args, **kwargs)
            except _RECORDED as exc:
                if call.retry(exc):
                    continue
                raise
            return call.done(value)

    return wrapper


class _ToolCall:
    """One call of a ``@guard.tool`` function: admitted when made (refuse new work), then
    recorded exactly once, however it ends."""

    __slots__ = (
        "args",
        "attempts",
        "cost_usd",
        "kwargs",
        "name",
        "poll",
        "retries",
        "run",
        "sig",
        "slot",
        "started",
    )

    def __init__(
        self,
        run: LiveRun,
        name: str,
        sig: inspect.Signature | None,
        args: tuple,
        kwargs: dict,
        retries: int,
        cost_usd: float | None = None,
        poll: bool = False,
    ) -> None:
        # No price given: the tool's mean cost per call so far (an implicit estimate).
        est = tool_estimate(run, name) if cost_usd is None else None
        price, context = (cost_usd, "") if est is None else est
        self.slot = reserve_tool(run, price, context)  # raises RunStopped before the tool runs
        self.cost_usd = cost_usd
        self.run, self.name, self.sig, self.args, self.kwargs = run, name, sig, args, kwargs
        self.retries = retries
        self.poll = poll
        self.started = time.time()
        self.attempts = 0

    def retry(self, exc: BaseException) -> bool:
        """After a failed attempt: ``True`` to try again; otherwise the failure is recorded
        and the caller re-raises. Stops and cancellations are never retried."""
        if (
            not isinstance(exc, _PASS_THROUGH)
            and self.attempts <= self.retries
            and not self.run.cancelled
        ):
            return True
        self._record(MISSING, exc)
        return False

    def done(self, value: Any) -> Any:
        self._record(value, None)
        return value

    def _record(self, value: Any, exc: BaseException | None) -> None:
        record_in_step(
            self.run,
            self.name,
            _call_args(self.sig, self.args, self.kwargs),
            result=value,
            attempts=self.attempts,
            cost_usd=self.cost_usd,
            error=exc,
            started_at=self.started,
            reservation=self.slot,
            poll=self.poll,
        )
