"""The run scope: start a run, attach it, admit it, finish it with its outcome, raise its stop.

One lifecycle for every way a run is held: ``@guard.run`` around a function, and the
integrations around a framework's run that is a context manager (Pydantic AI's ``agent.iter()``)
or an iterator the caller drives (LangGraph's ``stream``). Sync (``with``) and async
(``async with``) alike::

    with RunScope(spec) as run:          # the run is current; admitted (or refused) here
        ...                              # the block's exception decides the outcome
    # on exit: the outcome is recorded; a stop comes out as guard.RunStopped

Exit rules: a stop, or an exception that the stop caused, comes out as
``RunStopped`` with the final outcome (chained to the exception); any other exception goes on
unchanged; a block that ends normally while a stop is sticky raises ``RunStopped``.
``GeneratorExit`` (the consumer of a generator stopped reading) ends the run as it stands and
goes on. In async scopes the current task drives the run: a cancel cancels that task, and a
cancellation that came from outside the run is not turned into ``RunStopped``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Status as SpanStatus
from opentelemetry.trace import StatusCode

from guard import semconv as A
from guard.errors import GuardUnavailable, RunStopped
from guard.policy import DecidedBy, Reason, Status
from guard.sdk._outcome import final_outcome, outcome_attrs
from guard.sdk._run import LiveRun, _current, current_run_or_none
from guard.sdk._runtime import get_runtime

if TYPE_CHECKING:  # pragma: no cover
    from guard.sdk._decorator import RunSpec

__all__ = ["RunScope"]

log = logging.getLogger("guard.sdk")


class RunScope:
    """One guarded run around a block (``with`` or ``async with``; one use per instance).

    Entering starts the run (a sub-agent of the current run, if any), makes it the current
    run and waits, bounded by ``admit_timeout_ms``, for the guard's admit: a deny raises
    ``RunStopped`` there, an unanswered ``fail_closed`` run ``GuardUnavailable``. Leaving ends
    it (see the module docstring for what is raised).
    """

    __slots__ = ("_otel_token", "_token", "run", "spec")

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.run: LiveRun | None = None
        self._token: Any = None
        self._otel_token: Any = None

    # -- sync -----------------------------------------------------------------------------
    def __enter__(self) -> LiveRun:
        r = self._start(False)
        try:
            _admit_blocking(r, self.spec)
        except BaseException as exc:
            self._exit(exc)
            raise
        return r

    def __exit__(self, et: Any, exc: BaseException | None, tb: Any) -> bool:
        return self._exit(exc)

    # -- async ----------------------------------------------------------------------------
    async def __aenter__(self) -> LiveRun:
        r = self._start(True)
        r.task = asyncio.current_task()
        r.event_loop = asyncio.get_running_loop()
        if r.cancelled:  # cancelled during start (e.g. by a parent): deliver to the task now
            r._cancel_task()
        try:
            await _admit_awaiting(r, self.spec)
        except BaseException as exc:
            self._exit(exc)
            raise
        return r

    async def __aexit__(self, et: Any, exc: BaseException | None, tb: Any) -> bool:
        return self._exit(exc)

    # -- the lifecycle --------------------------------------------------------------------
    def _start(self, is_async: bool) -> LiveRun:
        spec = self.spec
        rt = get_runtime()
        parent = current_run_or_none()
        tenant = spec.tenant or (parent.tenant if parent is not None else rt.settings.tenant)
        r = LiveRun(
            rt,
            agent=spec.agent,
            tenant=tenant,
            limits=spec.effective(rt.policy_defaults),
            parent=parent,
            require_evidence=spec.require_evidence,
            is_async=is_async,
        )
        attrs: dict[str, Any] = {
            A.OPERATION: A.INVOKE_AGENT,
            A.AGENT_NAME: spec.agent,
            A.RUN_ID: r.run_id,
            A.TENANT: tenant,
        }
        if r.parent_run_id:
            attrs[A.PARENT_RUN_ID] = r.parent_run_id
        r.fail_closed = _fail_closed(r, spec)
        r.span = rt.tracer.start_span(f"{A.INVOKE_AGENT} {spec.agent}", attributes=attrs)
        r.ctx = trace.set_span_in_context(r.span)
        sc = r.span.get_span_context()
        if sc.is_valid:
            r.trace_id = format(sc.trace_id, "032x")
            rt.trace_started(sc.trace_id)
        self.run = r
        self._token = _current.set(r)
        self._otel_token = otel_context.attach(r.ctx)
        r._arm_deadline()
        return r

    def _exit(self, exc: BaseException | None) -> bool:
        """End the run; raise ``RunStopped`` when the run stopped, else return False."""
        r = self.run
        assert r is not None, "RunScope left before it was entered"
        if r.is_async:
            r.consume_task_cancel()
        if isinstance(exc, GeneratorExit):  # the caller stopped reading: ends as it stands
            self._finish(None)
            return False
        outcome, stopped = self._finish(exc)
        if exc is None:
            if stopped and r.stopped is None:
                raise RunStopped(outcome)
            return False
        task = r.task
        if isinstance(exc, asyncio.CancelledError) and task is not None and task.cancelling() > 0:
            return False  # cancelled from outside the run: the cancellation goes on
        if stopped:
            raise RunStopped(outcome) from (None if isinstance(exc, RunStopped) else exc)
        return False

    def _finish(self, exc: BaseException | None) -> tuple[Any, bool]:
        r = self.run
        assert r is not None
        try:
            outcome, stopped = final_outcome(r, exc)
            refused = getattr(exc, "outcome", None) if isinstance(exc, GuardUnavailable) else None
            if refused is not None:
                outcome, stopped = refused, False
        except Exception:  # pragma: no cover - never let bookkeeping break the agent
            log.exception("otel-guard: building the outcome failed")
            outcome, stopped = (
                r.snapshot(Status.FAILED, Reason.ERROR, "sdk error", DecidedBy.SDK),
                False,
            )
        r.outcome = outcome
        leftovers = r.end()
        if outcome.status is not Status.COMPLETED:
            for p in leftovers:  # a stopped run leaves no process behind
                p.terminate(r.rt.settings.kill_grace_s)
        try:
            span = r.span
            span.set_attributes(outcome_attrs(outcome))
            if outcome.status is Status.FAILED:
                span.set_status(SpanStatus(StatusCode.ERROR))
            span.end()
        except Exception:  # pragma: no cover
            log.exception("otel-guard: ending the run span failed")
        try:
            _current.reset(self._token)
            otel_context.detach(self._otel_token)
        except ValueError:  # pragma: no cover - unwound in another context
            pass
        sc = r.span.get_span_context()
        if sc.is_valid:
            r.rt.trace_ended(sc.trace_id)
        control = r.rt.control
        if control is not None:
            try:
                control.run_ended(r, outcome)
            except Exception:
                log.exception("otel-guard: reporting the run's end to the guard failed")
        return outcome, stopped


# ------------------------------------------------------------------------------ admission


def _fail_closed(r: LiveRun, spec: RunSpec) -> bool:
    return spec.fail_closed if spec.fail_closed is not None else r.rt.settings.fail_closed


def _admission(r: LiveRun, spec: RunSpec) -> concurrent.futures.Future[Any] | None:
    control = r.rt.control
    if control is None:
        return None
    try:
        return control.register(r, wait=_fail_closed(r, spec))
    except Exception:  # the guard connection never breaks the agent
        log.exception("otel-guard: registering the run with the guard failed")
        return None


def _admitted(r: LiveRun, spec: RunSpec, ok: bool) -> None:
    """After the admission wait: a deny raises now; an unanswered fail_closed run refuses."""
    r.check_stop()  # a deny is an interrupt: RunStopped before the first step
    if not ok and _fail_closed(r, spec):
        ms = r.rt.settings.admit_timeout_ms
        msg = f"guard did not admit run {r.run_id} within {ms:g} ms (fail_closed)"
        out = r.snapshot(Status.FAILED, Reason.ERROR, msg, DecidedBy.SDK)
        exc = GuardUnavailable(msg)
        exc.outcome = out  # type: ignore[attr-defined]
        raise exc


def _admit_blocking(r: LiveRun, spec: RunSpec) -> None:
    """Wait (bounded by ``admit_timeout_ms``) for the guard's answer to a sync run's start."""
    fut = _admission(r, spec)
    if fut is None:
        return
    timeout_s = r.rt.settings.admit_timeout_ms / 1000.0
    if asyncio._get_running_loop() is not None and not _fail_closed(r, spec):
        # A sync agent called on an event loop's thread: never stall the loop for the
        # admission; a deny that arrives later stops the run like a cancel.
        timeout_s = 0.0
    try:  # None = the stream dropped before an answer
        ok = fut.result(timeout=timeout_s) is not None
    except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
        ok = False
    _admitted(r, spec, ok)


async def _admit_awaiting(r: LiveRun, spec: RunSpec) -> None:
    """Await (bounded by ``admit_timeout_ms``) the guard's answer to an async run's start."""
    fut = _admission(r, spec)
    if fut is None:
        return
    try:  # None = the stream dropped before an answer
        answer = await asyncio.wait_for(
            asyncio.wrap_future(fut), r.rt.settings.admit_timeout_ms / 1000.0
        )
        ok = answer is not None
    except (TimeoutError, asyncio.CancelledError) as exc:
        if isinstance(exc, asyncio.CancelledError) and r.interrupt_info() is None:
            raise  # cancelled from outside while waiting
        ok = False
    _admitted(r, spec, ok)
