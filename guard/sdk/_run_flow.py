"""The run's own flow: the checks before new work and the one epilogue after every call.

:class:`RunFlow` is the part of :class:`guard.sdk._run.LiveRun` that steps, model calls, tool calls
and tool batches go through (``Step``, ``guard.sdk._calls``, ``guard.sdk._batch`` and the
third-party span counter call these methods, never the run's fields):

* :meth:`RunFlow.begin_step` before a step: interrupts, pending stops, the policy, then the count;
* the budget's fused calls (``run.budget.model_call_escalation(..., run.soft_rank)``) record usage
  and decide under one lock; :meth:`RunFlow.observe_action` / :meth:`RunFlow.end_step` feed
  the loop detector;
* :meth:`RunFlow.after_call` after each of them (the checks run after each model call and tool
  batch too, not only before new work): the decision is applied, the ancestors checked, the
  tenant allowance topped up, and an interrupt raised when asked.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from guard import semconv as A
from guard.errors import RunStopped
from guard.policy import (
    REASON_STATUS,
    Action,
    Budget,
    DecidedBy,
    Decision,
    LoopDetector,
    Phase,
    PollWatch,
    Reason,
    ResultNovelty,
    SoftLevel,
    Status,
)
from guard.sdk._outcome import Interrupt, cancel_message
from guard.sdk._procs import safe_call
from guard.sdk._reserve import tenant_after_call

if TYPE_CHECKING:  # pragma: no cover
    from guard.policy import Outcome
    from guard.sdk._run import LiveRun

__all__ = ["RunFlow"]

_CONTINUE, _STOP = Action.CONTINUE, Action.STOP
_BEFORE_STEP, _AFTER_TOOLS = Phase.BEFORE_STEP, Phase.AFTER_TOOL_BATCH


class RunFlow:
    """Checks, records and the after-call epilogue of a run (mixed into ``Run``)."""

    # Set by Run.__init__.
    parent: LiveRun | None
    root: LiveRun
    run_id: str
    allowance: Any
    budget: Budget
    detector: LoopDetector
    polls: PollWatch
    poll_tools: frozenset[str]
    novelty: ResultNovelty
    last_state: str | None
    soft: SoftLevel
    span: Any
    step_index: int
    last_tool: str | None
    last_action_hash: str | None
    did_work: bool
    warned: bool
    wrap_up_requested: bool
    directives: list[tuple[str, str, str, str]]
    stopped: tuple[Decision, DecidedBy] | None
    # Whether an interrupt (a cancel, a guard stop, the deadline) is waiting to be raised: a
    # plain attribute (set once, with the interrupt) because the hot paths read it per call.
    interrupted: bool
    _lock: threading.RLock
    _interrupt: Interrupt | None
    _pending: Decision | None
    _directive_cbs: list[Any]

    if TYPE_CHECKING:  # pragma: no cover - Run's

        def snapshot(
            self, status: Status, reason: Reason, message: str, by: DecidedBy
        ) -> Outcome: ...

    # -- before new work --------------------------------------------------------------------
    @property
    def stop_pending(self) -> bool:
        """Whether a stop decided by the policy is waiting for the next check."""
        return self._pending is not None

    def check_stop(self) -> None:
        """Raise ``RunStopped`` for an interrupt or a pending stop (no new policy evaluation)."""
        intr = self._interrupt
        if intr is not None:
            msg = cancel_message(intr.reason, intr.detail, intr.decided_by)
            status = REASON_STATUS[intr.reason]
            self.raise_stop(
                Decision(Action.STOP, status, intr.reason, message=msg), intr.decided_by
            )
        pending = self._pending
        if pending is not None:
            self.raise_stop(pending, DecidedBy.SDK)

    def check_interrupt(self) -> None:
        """Raise ``RunStopped`` for an interrupt (a cancel, a guard stop, the deadline) only;
        a pending stop waits for the next check."""
        if self._interrupt is not None:
            self.check_stop()

    def check(self, phase: Phase = Phase.BEFORE_STEP) -> None:
        """Full check before new work: interrupts, pending stops, then the policy."""
        if self._interrupt is not None or self._pending is not None:
            self.check_stop()
        # Only a decision stronger than the soft level already given can change anything, and
        # escalation() skips the evaluation when none can come out (hot path: 3 per step).
        d = self.budget.escalation(phase=phase, above=self.soft.level)
        if d is not None and d.action is not _CONTINUE:
            self.apply(d, raise_now=True)
        if self.parent is not None:
            self._check_ancestors(phase)

    def begin_step(self) -> tuple[int, int]:
        """Check before a new step and count it: ``(step index, record number)``.

        Raises ``RunStopped`` when the run must not take another step.
        """
        # The usual case, one lock: nothing can fire, and the step is recorded. Otherwise (or
        # in a nested run, whose ancestors are checked first) the full check, then the record.
        seq = 0
        if (
            self._interrupt is not None
            or self._pending is not None
            or self.parent is not None
            or not (seq := self.budget.step_if_no_escalation(self.soft.rank))
        ):
            self.check(_BEFORE_STEP)
            seq = self.budget.record_step()
        self.step_index = index = self.step_index + 1
        return index, seq

    # -- records ------------------------------------------------------------------------------
    @property
    def soft_rank(self) -> int:
        """The rank of the strongest soft directive given so far (0 none, 1 warn, 2 wrap_up):
        the ``rank`` of the budget's fused record-and-decide calls (only a stronger decision
        can change anything). Hand their decision to :meth:`after_call`."""
        return self.soft.rank

    def observe_action(self, name: str, action: str, result_hash: str | None, ok: bool) -> Any:
        """Feed one tool call to the loop detector (and its result to the novelty of the
        step's results); returns its verdict."""
        with self._lock:  # the loop detector is single-caller; parallel tools share it
            verdict = self.detector.observe_action(action, result_hash)
            self.novelty.observe(result_hash)
            self.last_tool = name
            self.last_action_hash = action
            if ok:
                self.did_work = True
        return verdict

    def observe_poll(self, name: str, action: str, result_hash: str | None, ok: bool) -> Any:
        """Feed one call of a declared poll to the poll rule (never to the loop detector);
        returns its verdict, decided like the detector's."""
        with self._lock:
            verdict = self.polls.observe(action, result_hash)
            self.novelty.note_poll()
            if verdict.level is not _CONTINUE:
                self.detector.hits += 1  # the run's loop_hits count every pattern's findings
            self.last_tool = name
            self.last_action_hash = action
            if ok:
                self.did_work = True
        return verdict

    def end_step(
        self, progress: bool | None, state: str | None, tool_calls: int, *, ok: bool
    ) -> tuple[bool | None, str | None]:
        """A step ends: what it reports to the stagnation detector (and on its span),
        ``(progress, state)``; when it ended normally (``ok``) the detector sees it, under the
        same lock, and a loop or no-progress verdict is decided like a tool batch's.

        The code's own ``progress`` or facts (``state``) always win. With neither, progress is
        derived from the step's tool results (:class:`~guard.policy.ResultNovelty`: a result new
        to the run is progress, only results seen before is none). A step whose calls were all
        declared polls is neither progress nor stale: it did not act, and an unchanged state
        it reports is left out (the guard, which counts its poll calls as actions, would
        otherwise count it stale).
        """
        verdict = None
        with self._lock:
            derived, only_polled = self.novelty.end_step()
            if progress is None and state is None:
                progress = derived
            elif only_polled and progress is None and state == self.last_state:
                state = None
            if state is not None:
                self.last_state = state
            if ok:
                acted = tool_calls > 0 and not only_polled
                verdict = self.detector.end_step(state=state, progress=progress, acted=acted)
        if verdict is not None and verdict.level is not _CONTINUE:
            self.after_call(_AFTER_TOOLS, self.decide_after(_AFTER_TOOLS, verdict))
        return progress, state

    # -- after a call ---------------------------------------------------------------------------
    def decide_after(self, phase: Phase, loop: Any = None) -> Decision | None:
        """Evaluate the policy after a call recorded without a decision (``None``: nothing)."""
        return self.budget.escalation(phase=phase, loop=loop, above=self.soft.level)

    def after_call(
        self,
        phase: Phase,
        d: Decision | None,
        *,
        spent: tuple[float | None, int] | None = None,
        raise_interrupt: bool = False,
    ) -> None:
        """The epilogue of every recorded model call, tool call and tool batch, in this order:

        1. the call's decision ``d`` is applied: a stop becomes pending, raised at the next SDK
           call (a result this call produced is kept), a warn / wrap_up is a directive;
        2. the ancestors are checked: a parent's stop stops this run too;
        3. ``spent=(cost_usd, tokens)`` (a model call that settled no reservation) keeps room
           in the tenant's allowance for the next call;
        4. ``raise_interrupt``: an interrupt that came in meanwhile is raised now (never from
           a span processor, which must not raise).

        With nothing for steps 1-3 to do (``d is None``, no ``parent``, and nothing ``spent`` or
        no ``root.allowance``) a hot path may skip the call and check ``interrupted`` itself
        (``Step.model_call``, ``record_tool_call``).
        """
        if d is not None and d.action is not _CONTINUE:
            self.apply(d, raise_now=False)
        if self.parent is not None:
            self._check_ancestors(phase, raise_now=False)
        if spent is not None:
            al = self.root.allowance
            if al is not None:
                tenant_after_call(self, al, spent[0], spent[1])  # type: ignore[arg-type]
        if raise_interrupt and self._interrupt is not None:
            self.check_stop()

    def _check_ancestors(self, phase: Phase, raise_now: bool = True) -> None:
        anc = self.parent
        while anc is not None:
            d = anc.budget.escalation(phase=phase, above=Action.WRAP_UP)  # only stops matter
            if d is not None and d.stop:
                anc.apply(d, raise_now=False)  # the parent stops when the child unwinds
                msg = f"parent run {anc.run_id}: {d.message}"
                self.apply(
                    Decision(d.action, d.status, d.reason, d.utilisation, d.metric, msg),
                    raise_now=raise_now,
                )
            anc = anc.parent

    # -- decisions ------------------------------------------------------------------------------
    def apply(self, d: Decision, *, raise_now: bool) -> None:
        if d.action is _STOP:
            if self._pending is None:
                self._pending = d
            if raise_now:
                self.raise_stop(d, DecidedBy.SDK)
            return
        act = self.soft.advance(d)
        if act is not None:
            self.directive(act.value, d.reason.value if d.reason else "", d.message, "sdk")

    def directive(self, action: str, reason: str, detail: str, source: str) -> None:
        """A warn / wrap_up from the local policy or the guard: exposed and recorded."""
        if action == Action.WARN.value:
            self.warned = True
        elif action == Action.WRAP_UP.value:
            self.wrap_up_requested = True
        self.directives.append((action, reason, detail, source))
        if self.span is not None:
            self.span.add_event(
                A.DIRECTIVE_EVENT_PREFIX + action,
                {A.DIRECTIVE_REASON: reason, A.DIRECTIVE_DECIDED_BY: source},
            )
        for cb in list(self._directive_cbs):
            safe_call(cb, action, reason, detail)

    def raise_stop(self, d: Decision, by: DecidedBy) -> None:
        if self.stopped is None:
            self.stopped = (d, by)
        raise RunStopped(
            self.snapshot(d.status or Status.FAILED, d.reason or Reason.ERROR, d.message, by)
        )
