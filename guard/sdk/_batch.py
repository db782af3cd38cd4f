"""Parallel tool batches: ``guard.admit_tools`` / ``guard.run_tools`` over any callable.

Each admitted call holds a slot (one tool call, and its estimated price for paid tools)
reserved atomically against the run, its ancestors and its tenant before it runs. A call
recorded while the batch is current (``@guard.tool``, ``step.tool_call``) consumes a slot; a
call a plain function ran is recorded by the batch itself (``run_tools``: per call, exactly;
``complete(results)``: the calls no record matched), so every executed call is counted and
fingerprinted exactly once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import json
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from guard.errors import BudgetExceeded, RunStopped
from guard.policy import Action, LoopVerdict, Phase
from guard.policy._reservation import check_money
from guard.sdk._calls import MISSING, current_batch, current_call, record_tool_call
from guard.sdk._implicit import tool_estimate
from guard.sdk._reserve import budget_stop, tenant_check
from guard.sdk._run import LiveRun, current_run_or_none
from guard.sdk._step import current_step

__all__ = ["ToolBatch", "admit_tools", "call_name_args", "record_in_step", "run_tools"]

_PASS_THROUGH = (RunStopped, asyncio.CancelledError, KeyboardInterrupt, SystemExit)

# ------------------------------------------------------------------------------- batches


def _call_id(call: Any) -> Any:
    if isinstance(call, dict):
        return call.get("id") or call.get("tool_call_id")
    return getattr(call, "id", None)


def _field(call: Any, *names: str) -> Any:
    for n in names:
        v = call.get(n) if isinstance(call, dict) else getattr(call, n, None)
        if v is not None:
            return v
    return None


def call_name_args(call: Any) -> tuple[str, Any]:
    """A tool call's name and arguments, from the shapes frameworks use: ``call.name`` /
    ``call["name"]`` (or an OpenAI-style ``function``), and ``args`` / ``arguments`` /
    ``input`` (a JSON text is parsed, so key order and spacing do not change the print)."""
    fn = _field(call, "function")
    name = _field(call, "name", "tool_name") or (_field(fn, "name") if fn is not None else None)
    args = _field(call, "args", "arguments", "input", "kwargs")
    if args is None and fn is not None:
        args = _field(fn, "arguments", "args")
    if isinstance(args, str | bytes):
        with contextlib.suppress(ValueError):
            args = json.loads(args)
    if name is None:  # a bare value (a string, a tuple): the call is its own name
        name, args = ("tool", call) if not isinstance(call, str) else (call, None)
    return str(name), args


def record_in_step(run: LiveRun, name: str, args: Any, **kw: Any) -> None:
    """Record a finished tool call in the run's current step (if this context has one of
    that run), else directly under the run."""
    step = current_step()
    if step is not None and step.run is not run:
        step = None
    if step is not None:
        step.tool_calls += 1
    record_tool_call(run, step._ctx if step is not None else run.ctx, step, name, args, **kw)


class _BatchCall:
    """One admitted call that ``run_tools`` runs: its own slot, claimed at most once."""

    __slots__ = ("batch", "claimed", "slot")

    def __init__(self, batch: ToolBatch, slot: Any) -> None:
        self.batch, self.slot, self.claimed = batch, slot, False


class ToolBatch:
    """A batch of parallel tool calls admitted atomically against ``max_tool_calls`` (and,
    for paid tools, ``max_cost_usd`` and the tenant's allowance).

    ``admitted``: the calls that may run; ``rejected``: the overflow, each answered by
    :meth:`rejection` (an explicit error result: a tool call must be answered, never dropped).
    Tool calls recorded while the batch is current (``@guard.tool``, ``step.tool_call``)
    consume the reserved slots; :meth:`complete` records the admitted calls nobody recorded
    (a plain function ran them: name and arguments from the call object, the result from
    ``results``), releases unused slots and evaluates the policy once for the whole batch.
    ``cost_usd``: the estimated price of each call (a number, or a function of the call),
    reserved with its slot.
    """

    def __init__(
        self,
        run: LiveRun | None,
        calls: Sequence[Any],
        cost_usd: float | Callable[[Any], float] | None = None,
    ) -> None:
        self.run = run
        self.calls = list(calls)
        self._slots: list[Any] = []
        self._lock = threading.Lock()
        self._verdict: LoopVerdict | None = None
        self._token: Any = None
        self._done = False
        self._recorded: collections.Counter[str] = collections.Counter()
        self._n_recorded = 0
        n_ok = len(self.calls)
        self.reason = ""
        if run is not None:
            run.check_stop()
            n_ok = 0
            paid = False
            refused: BudgetExceeded | None = None
            estimated = ""  # the refused call's price was an implicit estimate: which one
            for call in self.calls:
                price = cost_usd(call) if callable(cost_usd) else cost_usd
                if price is None and run.means.tools:  # the tool's mean so far (implicit)
                    est = tool_estimate(run, call_name_args(call)[0])
                    if est is not None:
                        price, estimated = est
                price = check_money("cost_usd", price) if price is not None else 0.0
                try:
                    slot = run.budget.reserve(tool_calls=1, cost_usd=price)
                except BudgetExceeded as exc:
                    refused = exc
                    u = run.budget.usage()
                    used = (
                        f"tool_calls={u.tool_calls}"
                        if exc.metric == "tool_calls"
                        else f"{exc.metric} used={getattr(u, exc.metric, 0) or 0:g}"
                    )
                    limit = "max_tool_calls" if exc.metric == "tool_calls" else f"max_{exc.metric}"
                    self.reason = (
                        f"rejected: {limit} reached ({used}, admitted in this batch={n_ok}, "
                        f"requested={exc.requested:g}, available={exc.available:g})"
                    )
                    break
                estimated = ""
                paid = paid or price > 0
                self._slots.append(slot)
                n_ok += 1
            if n_ok == 0 and refused is not None and refused.metric != "tool_calls":
                # Not one call fits the money left: the run cannot go on, so it stops with that
                # budget's reason, instead of answering every call with a rejection and leaving
                # the loop to spin on empty batches until another limit ends it.
                fits = f"no call of a batch of {len(self.calls)} fits"
                budget_stop(run, refused, f"{fits} ({estimated})" if estimated else fits)
            if paid:  # the tenant's allowance must cover the admitted calls' prices too
                tenant_check(run, self._release_slots)
            self._token = current_batch.set(self)
        self.admitted = self.calls[:n_ok]
        self.rejected = self.calls[n_ok:]

    def _release_slots(self) -> None:
        for slot in self._slots:
            slot.release()

    def rejection(self, call: Any) -> dict[str, Any]:
        """The error result for a rejected call (shape of a tool-result message)."""
        return {"tool_call_id": _call_id(call), "is_error": True, "content": self.reason}

    def take_slot(self) -> Any:
        """The slot a tool call of this context consumes: the one ``run_tools`` gave this
        context's call if unclaimed, else any unused slot of the batch."""
        bc = current_call.get()
        with self._lock:
            if bc is not None and bc.batch is self and not bc.claimed:
                bc.claimed = True
                return bc.slot
            return self._slots.pop() if self._slots else None

    def _own_slot(self) -> _BatchCall:
        with self._lock:
            return _BatchCall(self, self._slots.pop() if self._slots else None)

    def note_recorded(self, action: str) -> None:
        with self._lock:
            self._recorded[action] += 1
            self._n_recorded += 1

    def note_verdict(self, verdict: LoopVerdict) -> None:
        with self._lock:
            if verdict.level is not Action.CONTINUE and (
                self._verdict is None or verdict.level is Action.STOP
            ):
                self._verdict = verdict

    def record(self, call: Any, result: Any = MISSING, *, slot: Any = None, error=None) -> None:
        """Record one admitted call nobody recorded (a plain function ran it)."""
        run = self.run
        if run is None:
            return
        name, args = call_name_args(call)
        record_in_step(
            run, name, args, result=result, error=error, call_id=_call_id(call), reservation=slot
        )

    def _record_unrecorded(self, results: list[Any]) -> None:
        """``complete(results)``: the admitted calls with a result that no tool call recorded
        while the batch was current (matched by fingerprint) are recorded now."""
        run = self.run
        if run is None:
            return
        with self._lock:
            missing = len(self.admitted) - self._n_recorded
            seen = collections.Counter(self._recorded)
        for call, value in zip(self.admitted, results, strict=False):
            if missing <= 0:
                return
            name, args = call_name_args(call)
            fp = run.fp.action(name, args)
            if seen[fp] > 0:
                seen[fp] -= 1
                continue
            missing -= 1
            if isinstance(value, BaseException):
                self.record(call, error=value)
            else:
                self.record(call, value)

    def complete(self, results: Iterable[Any] = ()) -> list[Any]:
        """Record the calls a plain function ran, release unused slots, check the policy
        once, and return all results in call order.

        ``results`` are those of ``admitted`` (in order); rejected calls get their error
        result in place. Exceptions among ``results`` are turned into error results.
        """
        results = list(results)
        if results and not self._done:
            self._record_unrecorded(results)
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
            phase = Phase.AFTER_TOOL_BATCH
            run.after_call(phase, run.decide_after(phase, self._verdict))

    def __enter__(self) -> ToolBatch:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def admit_tools(
    calls: Sequence[Any], *, cost_usd: float | Callable[[Any], float] | None = None
) -> ToolBatch:
    """Admit a batch of parallel tool calls against the run's ``max_tool_calls`` (and, with
    ``cost_usd`` per call, its cost budget and the tenant's allowance).

    Reservation is atomic across threads and tasks, so concurrent batches never oversell.
    Outside a run everything is admitted.
    """
    return ToolBatch(current_run_or_none(), calls, cost_usd)


async def run_tools(
    calls: Sequence[Any],
    fn: Callable[[Any], Any],
    *,
    cost_usd: float | Callable[[Any], float] | None = None,
) -> list[Any]:
    """Admit ``calls``, run ``fn(call)`` for the admitted ones concurrently, answer them all.

    ``fn`` may be any function or coroutine function: a call it runs without recording it
    (not a ``@guard.tool``, no ``step.tool_call``) is recorded here (name and arguments from
    the call object, its result from the return value), and one it records is counted once.
    Returns one result per call in order: the tool's value, an explicit error result for a
    rejected call or a failed one. A cancel or a stop propagates (in-flight calls are
    cancelled with the run's task).
    """
    batch = admit_tools(calls, cost_usd=cost_usd)
    try:

        async def one(call: Any) -> Any:
            bc = batch._own_slot() if batch.run is not None else None
            token = current_call.set(bc)  # this task's context only
            try:
                res = fn(call)
                value = await res if inspect.isawaitable(res) else res
            except _PASS_THROUGH:
                if bc is not None and not bc.claimed and bc.slot is not None:
                    bc.slot.release()
                raise
            except Exception as exc:
                if bc is not None and not bc.claimed:
                    batch.record(call, error=exc, slot=bc.slot)
                raise
            finally:
                current_call.reset(token)
            if bc is not None and not bc.claimed:
                batch.record(call, value, slot=bc.slot)
            return value

        results = await asyncio.gather(*(one(c) for c in batch.admitted), return_exceptions=True)
        for r in results:
            if isinstance(r, RunStopped | asyncio.CancelledError):
                raise r
        return batch.complete(results)
    finally:
        batch.close()
