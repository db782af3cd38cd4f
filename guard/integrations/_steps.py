"""The run and the step an integration's call belongs to, and the guard-side failures.

Part of :mod:`guard.integrations._base` (which re-exports every public name here); kept apart
so that the tool admission (:mod:`guard.integrations._tools`) builds on it without importing
``_base``. :func:`active_run` is the live ``@guard.run`` of the context; :func:`step_for` the
step a model or tool call belongs to: the code's own, else one the integration infers (one per
run, closed by :func:`end_inferred_step`); :func:`note_error` logs and counts a guard-side
failure (:func:`errors`), which never breaks the user's call.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

from opentelemetry import context as otel_context

from guard.sdk._run import LiveRun, current_run_or_none
from guard.sdk._step import Step, _current_step, current_step

__all__ = ["active_run", "end_inferred_step", "errors", "note_error", "step_for"]

log = logging.getLogger("guard.integrations")

_errors: dict[str, int] = {}
_errors_lock = threading.Lock()
_LOGGED_PER_SITE = 5  # then only counted: a broken hook must not flood the logs


def note_error(site: str) -> None:
    """Log (the first few per site) and count a guard-side failure; call from ``except``."""
    with _errors_lock:
        n = _errors[site] = _errors.get(site, 0) + 1
    if n <= _LOGGED_PER_SITE:
        log.exception("otel-guard integration: %s failed (the call goes on unguarded)", site)


def errors() -> dict[str, int]:
    """Guard-side failures of the integrations, per site (never raised to the user)."""
    with _errors_lock:
        return dict(_errors)


def active_run() -> LiveRun | None:
    """The live ``@guard.run`` of this context, or ``None`` (a plain client is not an agent)."""
    run = current_run_or_none()
    return run if run is not None and run.live else None


# -- inferred steps --------------------------------------------------------------------------
class _Inferred:
    """The step an integration opened for a run whose code opened none (one per run)."""

    __slots__ = ("lock", "step", "tools_at_open")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.step: Step | None = None
        self.tools_at_open = 0

    def open(self, run: LiveRun) -> Step:
        st = Step(run)
        st.__enter__()  # the SDK's own step start: the checks, the count, the span
        # ... but not in the caller's context: a step that outlives this call must not leave
        # a context token behind (frameworks open and close their own spans around it).
        _current_step.reset(st._token)
        otel_context.detach(st._otel_token)
        self.step, self.tools_at_open = st, run.budget.usage().tool_calls
        run.inferred_step = st  # where guard.progress() reports from inside the framework
        return st

    def close(self, run: LiveRun) -> None:
        st, self.step = self.step, None
        run.inferred_step = None
        if st is None or st.span is None:
            return
        # Tool calls recorded while it was open (@guard.tool records under the run) are the
        # step's actions: they make an unchanged state a stale step.
        st.tool_calls += max(0, run.budget.usage().tool_calls - self.tools_at_open)
        st._otel_token = otel_context.attach(st._ctx)  # re-entered for a clean, in-order exit
        st._token = _current_step.set(st)
        st.__exit__(None, None, None)


_inferred: weakref.WeakKeyDictionary[LiveRun, _Inferred] = weakref.WeakKeyDictionary()
_inferred_lock = threading.Lock()


def _tracker(run: LiveRun) -> _Inferred:
    with _inferred_lock:
        tr = _inferred.get(run)
        if tr is None:
            tr = _inferred[run] = _Inferred()
            end = run.end

            def end_with_step() -> Any:  # the run's end closes its last inferred step
                end_inferred_step(run)
                return end()

            # The SDK has no run-end hook yet: this run's own end() is wrapped (instance only).
            run.end = end_with_step  # type: ignore[method-assign]
    return tr


def step_for(run: LiveRun, *, new_turn: bool) -> Step:
    """The step a model call or tool call belongs to: the code's own open step of ``run``, else
    the inferred one. ``new_turn`` (a model call): close the inferred step and open the next
    one, so a step is one model turn plus the tools it asked for. Opening a step runs the
    before-step checks (``RunStopped`` for max_steps, a cancel, a pending stop)."""
    st = current_step()
    if st is not None and st.run is run and st.span is not None:
        return st
    tr = _tracker(run)
    with tr.lock:
        cur = tr.step
        if cur is not None and not new_turn:
            return cur
        if cur is not None:
            try:
                tr.close(run)
            except Exception:
                note_error("closing an inferred step")
        return tr.open(run)


def end_inferred_step(run: LiveRun) -> None:
    """Close ``run``'s inferred step, if one is open (the framework's run or the run ended)."""
    tr = _inferred.get(run)
    if tr is None:
        return
    with tr.lock:
        try:
            tr.close(run)
        except Exception:
            note_error("closing an inferred step")
