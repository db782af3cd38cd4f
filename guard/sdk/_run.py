"""The live run: budget, loop detector, cancellation and the stop state machine.

Stop paths, all ending in one :class:`~guard.policy.Outcome`:

* a *check* before a step or tool call finds a hard limit reached -> ``RunStopped`` now;
* a decision *after* a model call or tool batch finds a limit reached -> the stop is pending
  and raised at the next SDK call (so a final answer produced by that call still completes:
  completion wins over a budget reached in the same step);
* an *interrupt* (``run.cancel``, a guard command, the deadline timer) from any thread: new
  work is refused at once, the async task is cancelled, tracked process groups get SIGTERM then
  SIGKILL and ``on_cancel`` callbacks run, in that order; completed results are kept and the
  outcome is reported when the decorated function unwinds.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from guard import semconv as A
from guard.policy import (
    Budget,
    DecidedBy,
    Decision,
    Limits,
    LoopDetector,
    PollWatch,
    Reason,
    Remaining,
    ResultNovelty,
    SoftLevel,
    Status,
)
from guard.sdk._handle import Run
from guard.sdk._implicit import Means
from guard.sdk._outcome import Interrupt, build_outcome
from guard.sdk._procs import TrackedProcess, safe_call
from guard.sdk._run_flow import RunFlow
from guard.sdk._tool_ledger import ToolLedger

if TYPE_CHECKING:  # pragma: no cover
    from guard.policy import Outcome
    from guard.sdk._runtime import Runtime

__all__ = ["LiveRun", "current_run_or_none"]

log = logging.getLogger("guard.sdk")

_current: contextvars.ContextVar[LiveRun | None] = contextvars.ContextVar("guard_run", default=None)
# Tasks whose cancellation the SDK requested, and by which run (to uncancel exactly once).
_task_cancels: dict[asyncio.Task[Any], LiveRun] = {}


def current_run_or_none() -> LiveRun | None:
    return _current.get()


class LiveRun(RunFlow):
    """One guarded run, with the SDK's machinery. Agent code sees its :class:`Run` handle
    (``guard.current_run()``); the integrations and the SDK work on this object."""

    def __init__(
        self,
        rt: Runtime,
        *,
        agent: str,
        tenant: str,
        limits: Limits,
        parent: LiveRun | None,
        require_evidence: tuple[str, ...] = (),
        is_async: bool = False,
    ) -> None:
        self.rt = rt
        self.run_id = uuid.uuid4().hex
        self.agent = agent
        self.tenant = tenant
        self.parent = parent
        self.parent_run_id = parent.run_id if parent is not None else None
        # The root run holds the tenant allowance for the whole tree (sub-agents spend it).
        self.root: LiveRun = parent.root if parent is not None else self
        self.allowance: Any = None  # guard.sdk._reserve.Ceilings, pushed by the guard
        self.fail_closed = False  # set by the decorator: refuse when the guard cannot answer
        self.requested = limits
        self.clock = rt.clock
        self.budget = Budget(
            limits, parent=parent.budget if parent is not None else None, clock=rt.clock.monotonic
        )
        self.detector = LoopDetector(limits.loop)
        # The poll rule, the tools the policy names as polls, and the progress derived from
        # tool results for steps whose code reports none (guard.policy._polls, _novelty).
        self.polls = PollWatch(limits.loop)
        self.poll_tools = frozenset(limits.loop.poll_tools)
        self.novelty = ResultNovelty()
        self.last_state: str | None = None  # the state hash the last step ended with
        self.fp = rt.fingerprinter_for(limits.loop.ignore_fields)
        self.fp_ignore_fields = limits.loop.ignore_fields
        self.soft = SoftLevel()
        self.require_evidence = require_evidence
        self.is_async = is_async
        self.price_book_version = rt.price_book_version
        self.started_at = time.time()
        self.t0 = self.clock.monotonic()
        self.trace_id = ""
        self.span: Any = None
        self.ctx: Any = None
        self.task: asyncio.Task[Any] | None = None
        self.event_loop: asyncio.AbstractEventLoop | None = None
        self.outcome: Outcome | None = None
        self.evidence_seen: dict[str, bool] = {}
        self.last_tool: str | None = None
        self.last_action_hash: str | None = None
        self.step_index = 0
        self.numbered = rt.number_spans  # counted spans carry guard.seq (Runtime)
        self.did_work = False
        self.foreign_calls: Any = None  # guard.sdk._foreign.RunCalls, once a span is counted
        self.means = Means()  # mean cost per step / per tool call: the implicit estimates
        # the largest reply of its model calls: the output an integration holds for a request
        # that sets no max tokens (0: none yet)
        self.max_output_tokens_seen = 0
        self.tool_ledger = ToolLedger()  # the tool calls of its conversation it has accounted for
        # the step an integration inferred for the current model turn (guard.progress())
        self.inferred_step: Any = None
        self.partial_result: bool | None = None  # the user may say so explicitly
        # a framework said the run can be resumed where it ended (an interrupted graph)
        self.resumable = False
        self.warned = False
        self.wrap_up_requested = False
        self.directives: list[tuple[str, str, str, str]] = []  # (action, reason, detail, source)
        self._lock = threading.RLock()
        self._children: list[LiveRun] = []
        self._procs: list[TrackedProcess] = []
        self._cancel_cbs: list[Callable[[], Any]] = []
        self._directive_cbs: list[Callable[[str, str, str], Any]] = []
        self._interrupt: Interrupt | None = None
        self.interrupted = False  # _interrupt is not None (RunFlow.interrupted)
        self._pending: Decision | None = None
        self.stopped: tuple[Decision, DecidedBy] | None = None  # a stop raised to the user
        self._deadline_timer: Any = None  # a handle of self.clock.schedule
        self.live = True
        self.handle = Run(self)  # what guard.current_run() gives agent code
        if parent is not None:
            with parent._lock:
                parent._children.append(self)

    # -- public surface (documented on guard.Run, the handle agent code holds) -------------
    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"<guard.Run {self.agent} {self.run_id} steps={self.budget.usage().steps}>"

    @property
    def limits(self) -> Limits:
        return self.budget.limits

    @property
    def cancelled(self) -> bool:
        return self._interrupt is not None

    @property
    def paused(self) -> bool:
        return self.budget.paused

    def usage(self) -> Any:
        return self.budget.usage()

    def remaining(self) -> Remaining:
        return self.budget.remaining()

    def timeout(self, configured_s: float | None = None) -> float | None:
        return self.budget.effective_timeout(configured_s)

    def raise_if_cancelled(self) -> None:
        if self._interrupt is not None or self._pending is not None:
            self.check_stop()

    def cancel(self, reason: str | Reason = "user_cancel", detail: str = "") -> bool:
        try:
            r = Reason(reason)
        except ValueError:
            r, detail = Reason.USER_CANCEL, detail or str(reason)
        by = DecidedBy.OPERATOR if r is Reason.OPERATOR_CANCEL else DecidedBy.SDK
        return self.interrupt(r, detail, by)

    def on_cancel(self, callback: Callable[[], Any]) -> None:
        with self._lock:
            fire = self._interrupt is not None
            if not fire:
                self._cancel_cbs.append(callback)
        if fire:
            safe_call(callback)

    def on_directive(self, callback: Callable[[str, str, str], Any]) -> None:
        self._directive_cbs.append(callback)

    def track_process(self, proc: Any) -> Any:
        tp = TrackedProcess(proc)
        with self._lock:
            self._procs = [p for p in self._procs if p.pgid is not None or p.alive()]
            self._procs.append(tp)
            fire = self._interrupt is not None
        if fire:
            tp.terminate(self.rt.settings.kill_grace_s)
        return proc

    def adopt_limits(self, admitted: Limits) -> None:
        """Apply the guard's Admit: the effective limits are the tightest of the admitted and
        the current ones, budget and loop detection alike."""
        limits = self.budget.limits.tighten(admitted)
        self.budget.set_limits(limits)
        loop = limits.loop
        with self._lock:
            old = self.detector
            s = old.settings
            if (loop.window, loop.repeat_threshold, loop.no_progress_steps) != (
                s.window,
                s.repeat_threshold,
                s.no_progress_steps,
            ):
                # Normally before the first step (a run waits for its admit); a late admit
                # restarts the detection window under the stricter settings.
                self.detector = LoopDetector(loop)
                self.detector.hits = old.hits
            self.polls.adopt(loop)
            self.poll_tools = frozenset(loop.poll_tools)
            if set(loop.ignore_fields) != set(self.fp_ignore_fields):
                self.fp = self.rt.fingerprinter_for(loop.ignore_fields)
                self.fp_ignore_fields = loop.ignore_fields
        self._arm_deadline()

    def pause(self, reason: str = "") -> None:
        self.budget.pause()
        if self.limits.pause_freezes_deadline:
            self._disarm_deadline()
        if self.span is not None:
            self.span.add_event(A.PAUSE_EVENT, {A.PAUSE_REASON_FP: self.fp.text(reason)})

    def resume(self) -> None:
        self.budget.resume()
        self._arm_deadline()
        if self.span is not None:
            self.span.add_event(A.RESUME_EVENT)

    def evidence(self, name: str, ok: bool = True) -> None:
        with self._lock:
            self.evidence_seen[name] = bool(ok)  # the latest word wins (tests fixed, re-run)
        if self.span is not None:
            self.span.add_event(A.EVIDENCE_EVENT, {A.EVIDENCE_NAME: name, A.EVIDENCE_OK: bool(ok)})

    def mark_partial(self, value: bool = True) -> None:
        self.partial_result = value

    # -- interrupts (any thread) ----------------------------------------------------------
    def interrupt(
        self, reason: Reason, detail: str = "", by: DecidedBy = DecidedBy.SDK, *, cancel=True
    ) -> bool:
        """Stop the run from outside its flow: refuse new work first, then stop the work in
        flight (the task, the process groups, the ``on_cancel`` callbacks); what completed stays
        recorded. Thread-safe, idempotent."""
        with self._lock:
            if not self.live or self._interrupt is not None:
                return self.live
            if self.stopped is not None and by is DecidedBy.GUARD:
                # Already stopped in-process (the stop raised to the code is sticky): the
                # guard's cancel, decided from the same spans, must not also cancel the
                # task in the middle of the code's own handling of that stop.
                return True
            # 1. refuse new work: every SDK call raises from now on.
            self._interrupt = Interrupt(reason, detail, by, cancel)
            self.interrupted = True
            children = list(self._children)
            procs, self._procs = self._procs, []
            cbs, self._cancel_cbs = self._cancel_cbs, []
        self._disarm_deadline()
        for child in children:
            child.interrupt(reason, detail, by, cancel=cancel)
        # 2. stop in-flight work: the awaiting task, the process groups, user callbacks.
        if self.is_async and self.task is not None and self.event_loop is not None:
            with contextlib.suppress(RuntimeError):  # loop closed: nothing in flight any more
                self.event_loop.call_soon_threadsafe(self._cancel_task)
        grace = self.rt.settings.kill_grace_s
        for p in procs:
            p.terminate(grace)
        for cb in cbs:
            safe_call(cb)
        # 3./4. completed results stay recorded; the decorator reports the outcome.
        return True

    def _cancel_task(self) -> None:
        task = self.task
        if not self.live or task is None or task.done() or task in _task_cancels:
            return
        _task_cancels[task] = self
        task.cancel(msg=f"otel-guard: run {self.run_id} stopped")

    def consume_task_cancel(self) -> bool:
        """On unwind: undo the SDK's own task cancellation (only the run that made it)."""
        task = self.task
        if task is not None and _task_cancels.get(task) is self:
            del _task_cancels[task]
            task.uncancel()
            return True
        return False

    def _arm_deadline(self) -> None:
        deadline = self.limits.deadline_s
        if deadline is None or self._interrupt is not None or not self.live:
            return
        self._disarm_deadline()
        left = deadline - self.budget.elapsed_s()
        self._deadline_timer = self.clock.schedule(left, self._deadline_fired)

    def _disarm_deadline(self) -> None:
        t, self._deadline_timer = self._deadline_timer, None
        if t is not None:
            t.cancel()

    def _deadline_fired(self) -> None:
        if self.paused and self.limits.pause_freezes_deadline:
            return
        left = (self.limits.deadline_s or 0.0) - self.budget.elapsed_s()
        if left > 0.001:  # limits changed or paused time excluded: re-arm
            self._deadline_timer = self.clock.schedule(left, self._deadline_fired)
            return
        msg = f"deadline_s {self.limits.deadline_s:g} reached (elapsed_s={self.elapsed_s():.3f})"
        self.interrupt(Reason.DEADLINE, msg, DecidedBy.SDK, cancel=False)

    # -- outcome ----------------------------------------------------------------------------
    def elapsed_s(self) -> float:
        return self.clock.monotonic() - self.t0

    def snapshot(self, status: Status, reason: Reason, message: str, by: DecidedBy) -> Outcome:
        return build_outcome(self, status, reason, message, by)

    def interrupt_info(self) -> Interrupt | None:
        return self._interrupt

    def end(self) -> list[TrackedProcess]:
        """Mark the run over; returns processes still tracked (for cleanup on stop)."""
        with self._lock:
            self.live = False
            procs, self._procs = self._procs, []
        self._disarm_deadline()
        if self.parent is not None:
            with self.parent._lock:
                if self in self.parent._children:
                    self.parent._children.remove(self)
        return procs
