"""Tool admission for framework integrations (part of :mod:`guard.integrations._base`, which
re-exports both names)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from guard.integrations._steps import active_run, note_error, step_for
from guard.sdk._batch import call_name_args
from guard.sdk._calls import MISSING, record_tool_call, reserve_tool
from guard.sdk._run import LiveRun
from guard.sdk._tool_ledger import ToolInvocation, invoking

__all__ = ["ToolCall", "admit_tool"]


# -- tools -----------------------------------------------------------------------------------
class ToolCall:
    """One admitted tool call; :meth:`done` or :meth:`failed` records it exactly once."""

    __slots__ = ("args", "fingerprint", "inv", "name", "recorded", "run", "slot", "started_at")

    def __init__(self, run: LiveRun, name: str, args: Any, slot: Any) -> None:
        self.run, self.name, self.args, self.slot = run, name, args, slot
        self.started_at = time.time()
        self.recorded = False
        self.inv: ToolInvocation | None = None
        self.fingerprint = run.fp.action(name, args)  # in-process: only the HMAC leaves

    @contextlib.contextmanager
    def running(self, call_id: str | None) -> Iterator[None]:
        """Around the framework's execution of the tool: a ``@guard.tool`` inside, recording
        in this run, is this call (it takes ``call_id``), and this one is then not recorded."""
        with invoking(self.run, call_id) as self.inv:
            yield

    def release(self) -> None:
        """Not recorded here (the tool's own code recorded it, or the run stopped): the quota
        slot is given back."""
        if self.recorded:
            return
        self.recorded = True
        if self.slot is not None:
            try:
                self.slot.release()
            except Exception:
                note_error("releasing a tool slot")

    def _record(self, result: Any, error: BaseException | None, call_id: str | None) -> None:
        if self.inv is not None and self.inv.by_code:
            self.release()  # counted once, where the tool's own code recorded it
            return
        if self.recorded:
            return
        self.recorded = True
        run = self.run
        step = step_for(run, new_turn=False)
        step.tool_calls += 1
        record_tool_call(
            run,
            step._ctx,
            step,
            self.name,
            self.args,
            result,
            error=error,
            call_id=call_id,
            started_at=self.started_at,
            reservation=self.slot,
        )

    def done(self, result: Any, *, call_id: str | None = None) -> None:
        """Record the result (its hash feeds loop detection). A stop it reached is raised at
        the run's next model call, never as this tool's result."""
        try:
            self._record(result, None, call_id)
        except Exception:
            note_error("recording a tool call")

    def failed(self, exc: BaseException, *, call_id: str | None = None) -> None:
        """Record a tool error (the same error again is "no new information")."""
        try:
            self._record(MISSING, exc, call_id)
        except Exception:
            note_error("recording a tool call")


def admit_tool(name: str, arguments: Any = None, run: LiveRun | None = None) -> ToolCall | None:
    """Admit a tool call before it runs; ``None`` outside a run (nothing to guard).

    ``arguments`` may be a mapping or the model's JSON text (parsed, so key order and spacing
    do not change the fingerprint). ``RunStopped`` when the run is cancelled or stopped or the
    tool quota is used up: the framework integration lets it out of the framework's run (the
    tool does not run, and no result reaches the model).
    """
    run = run if run is not None else active_run()
    if run is None:
        return None
    slot = reserve_tool(run)  # RunStopped: refused
    name, args = call_name_args({"name": name, "arguments": arguments})
    return ToolCall(run, name, args, slot)
