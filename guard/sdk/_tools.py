"""``@guard.tool`` and parallel tool batches admitted against ``max_tool_calls``."""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar, overload

from guard.errors import BudgetExceeded, RunStopped
from guard.policy import Action, LoopVerdict, Phase
from guard.sdk._calls import MISSING, current_batch, record_tool_call, reserve_tool
from guard.sdk._run import Run, current_run_or_none
from guard.sdk._step import current_step

__all__ = ["ToolBatch", "admit_tools", "run_tools", "tool"]

F = TypeVar("F", bound=Callable[..., Any])
_PASS_THROUGH = (RunStopped, asyncio.CancelledError, KeyboardInterrupt, SystemExit)
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
def tool(fn: F) -> F: ...
@overload
def tool(*, name: str | None = None, retries: int = 0) -> Callable[[F], F]: ...


def tool(fn: Any = None, *, name: str | None = None, retries: int = 0) -> Any:
    """Record every call of a tool function: fingerprint, result hash, attempts, errors.

    ``@guard.tool`` or ``@guard.tool(name="search", retries=2)``; sync or async. Outside a run
    the function runs untouched. A call is admitted first (cancelled runs and an exhausted
    ``max_tool_calls`` refuse it without running it); ``retries`` re-runs a failing call and
    counts every attempt. An exception is recorded as a tool_error observation and re-raised.
    """
    if fn is None:
        return lambda f: tool(f, name=name, retries=retries)
    tool_name = name or getattr(fn, "__name__", "tool")
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
            call = _ToolCall(run, tool_name, sig, args, kwargs, retries)
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
        call = _ToolCall(run, tool_name, sig, args, kwargs, retries)
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

    __slots__ = ("args", "attempts", "kwargs", "name", "retries", "run", "sig", "slot", "started")

    def __init__(
        self,
        run: Run,
        name: str,
        sig: inspect.Signature | None,
        args: tuple,
        kwargs: dict,
        retries: int,
    ) -> None:
        self.slot = reserve_tool(run)  # raises RunStopped before the tool runs
        self.run, self.name, self.sig, self.args, self.kwargs = run, name, sig, args, kwargs
        self.retries = retries
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
        run = self.run
        step = current_step()
        if step is not None and step.run is not run:
            step = None
        if step is not None:
            step.tool_calls += 1
        record_tool_call(
            run,
            step._ctx if step is not None else run.ctx,
            step,
            self.name,
            _call_args(self.sig, self.args, self.kwargs),
            result=value,
            attempts=self.attempts,
            error=exc,
            started_at=self.started,
            reservation=self.slot,
        )


# ------------------------------------------------------------------------------- batches


def _call_id(call: Any) -> Any:
    if isinstance(call, dict):
        return call.get("id") or call.get("tool_call_id")
    return getattr(call, "id", None)


class ToolBatch:
    """A batch of parallel tool calls admitted atomically against ``max_tool_calls``.

    ``admitted``: the calls that may run; ``rejected``: the overflow, each answered by
    :meth:`rejection` (an explicit error result: a tool call must be answered, never dropped).
    Tool calls recorded while the batch is current (``@guard.tool``, ``step.tool_call``)
    consume the reserved slots; :meth:`complete` releases unused slots and evaluates the
    policy once for the whole batch.
    """

    def __init__(self, run: Run | None, calls: Sequence[Any]) -> None:
        self.run = run
        self.calls = list(calls)
        self._slots: list[Any] = []
        self._lock = threading.Lock()
        self._verdict: LoopVerdict | None = None
        self._token: Any = None
        self._done = False
        n_ok = len(self.calls)
        self.reason = ""
        if run is not None:
            run.check_stop()
            n_ok = 0
            for _ in self.calls:
                try:
                    slot = run.budget.reserve(tool_calls=1)
                except BudgetExceeded as exc:
                    u = run.budget.usage()
                    self.reason = (
                        f"rejected: max_tool_calls reached (tool_calls={u.tool_calls}, "
                        f"admitted in this batch={n_ok}, available={exc.available:g})"
                    )
                    break
                self._slots.append(slot)
                n_ok += 1
            self._token = current_batch.set(self)
        self.admitted = self.calls[:n_ok]
        self.rejected = self.calls[n_ok:]

    def rejection(self, call: Any) -> dict[str, Any]:
        """The error result for a rejected call (shape of a tool-result message)."""
        return {"tool_call_id": _call_id(call), "is_error": True, "content": self.reason}

    def take_slot(self) -> Any:
        with self._lock:
            return self._slots.pop() if self._slots else None

    def note_verdict(self, verdict: LoopVerdict) -> None:
        with self._lock:
            if verdict.level is not Action.CONTINUE and (
                self._verdict is None or verdict.level is Action.STOP
            ):
                self._verdict = verdict

    def complete(self, results: Iterable[Any] = ()) -> list[Any]:
        """Release unused slots, check the policy once, and return all results in call order.

        ``results`` are those of ``admitted`` (in order); rejected calls get their error
        result in place. Exceptions among ``results`` are turned into error results.
        """
        out: list[Any] = []
        it = iter(results)
        n_ok = len(self.admitted)
        for i, call in enumerate(self.calls):
            if i >= n_ok:
                out.append(self.rejection(call))
                continue
            value = next(it, None)
            if isinstance(value, BaseException):
                value = {
                    "tool_call_id": _call_id(call),
                    "is_error": True,
                    "content": f"error: {type(value).__name__}",
                }
            out.append(value)
        self.close()
        return out

    def close(self) -> None:
        if self._done:
            return
        self._done = True
        with self._lock:
            slots, self._slots = self._slots, []
        for s in slots:
            s.release()
        if self._token is not None:
            try:
                current_batch.reset(self._token)
            except ValueError:
                current_batch.set(None)
        run = self.run
        if run is not None:
            run.after(Phase.AFTER_TOOL_BATCH, self._verdict)

    def __enter__(self) -> ToolBatch:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def admit_tools(calls: Sequence[Any]) -> ToolBatch:
    """Admit a batch of parallel tool calls against the run's ``max_tool_calls``.

    Reservation is atomic across threads and tasks, so concurrent batches never oversell.
    Outside a run everything is admitted.
    """
    return ToolBatch(current_run_or_none(), calls)


async def run_tools(calls: Sequence[Any], fn: Callable[[Any], Any]) -> list[Any]:
    """Admit ``calls``, run ``fn(call)`` for the admitted ones concurrently, answer them all.

    Returns one result per call in order: the tool's value, an explicit error result for a
    rejected call or a failed one. A cancel or a stop propagates (in-flight calls are
    cancelled with the run's task).
    """
    batch = admit_tools(calls)
    try:

        async def one(call: Any) -> Any:
            res = fn(call)
            return await res if inspect.isawaitable(res) else res

        results = await asyncio.gather(*(one(c) for c in batch.admitted), return_exceptions=True)
        for r in results:
            if isinstance(r, RunStopped | asyncio.CancelledError):
                raise r
        return batch.complete(results)
    finally:
        batch.close()
