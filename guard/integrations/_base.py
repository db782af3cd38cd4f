"""The contract every integration shares: runs, inferred steps, guarded model calls, tools.

An integration adapts one library; the guarding is done here, once, with the SDK's own parts:

* :func:`in_run` / :func:`in_run_async` run a framework's run inside the active ``@guard.run``
  (attach) or, when none is active, inside a new run named after the framework's agent. A stop
  the framework caught and turned into something else (a tool result, its own exception, a
  normal return) is raised again as ``guard.RunStopped`` when the framework's run returns.
  A framework run nested in another one of the same run (an agent called as a tool, a
  guardrail running an agent) shares its inferred step: only the outermost one closes it
  (:mod:`guard.integrations._framework_runs`).
* :func:`begin_call` guards one model call before it leaves (a body of both forms,
  :mod:`._twins`: ``drive`` it in sync code, ``await adrive`` it in async code):
  a cancelled or stopped run raises ``RunStopped`` (so at most the call in flight completes
  after a cancel), a step is inferred when the code opened none (:func:`step_for`), and the
  whole request (its prompt counted from the request, and its output: ``max_tokens``, else
  the run's largest reply so far; :mod:`guard.integrations._estimate`) is reserved against
  the run, its ancestors and its tenant (``step.reserve``). :meth:`ModelCall.finish` records
  the usage and the response id once and settles the reservation; :meth:`ModelCall.fail`
  records a model error.
* :func:`admit_tool` admits one tool call before it runs (a stopped run or an exhausted quota
  raises ``RunStopped`` and the tool does not run); :meth:`ToolCall.done` records its
  fingerprint and result hash in-process, so loop detection sees it and no raw argument leaves.
* Counted once: while a guarded model call is in flight, the OpenTelemetry context carries
  :data:`COUNTED_KEY` (``True``) and the inferred step's span, so another instrumentation's
  span of the same call starts under the step with the marker in its parent context; the SDK's
  span processor for third-party spans reads it and does not count that span again.

Guard-side failures never break the user's call: they are logged and counted
(:func:`errors`); only a real stop raises ``RunStopped``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

from opentelemetry import context as otel_context

from guard.errors import RunStopped
from guard.integrations._estimate import Prompt, output_tokens, prompt_tokens
from guard.integrations._framework_runs import outermost
from guard.integrations._framework_runs import swallowed as _swallowed
from guard.integrations._steps import (
    active_run,
    end_inferred_step,
    errors,
    note_error,
    step_for,
)
from guard.integrations._tools import ToolCall, admit_tool
from guard.integrations._twins import Body
from guard.sdk._config import get_settings
from guard.sdk._decorator import agent_spec

# COUNTED_KEY: the OpenTelemetry context key set while an integration's guarded model call is
# in flight: a third-party span started under it is the same call, already counted by the
# integration (the SDK's processor of third-party spans reads it: guard.sdk._foreign).
from guard.sdk._foreign import COUNTED_KEY, note_integrated
from guard.sdk._foreign_calls import record_integrated
from guard.sdk._reserve import current_reservation, make_reservation
from guard.sdk._run import LiveRun
from guard.sdk._scope import RunScope
from guard.sdk._step import Step

__all__ = [
    "COUNTED_KEY",
    "ModelCall",
    "Prompt",
    "ToolCall",
    "Usage",
    "active_run",
    "admit_tool",
    "begin_call",
    "end_inferred_step",
    "errors",
    "in_run",
    "in_run_async",
    "note_error",
    "step_for",
]


# -- runs ------------------------------------------------------------------------------------
@contextlib.contextmanager
def _framework_run(run: LiveRun) -> Iterator[None]:
    """Around a framework's run attached to ``run``: the inferred step closes when the
    outermost framework run of ``run`` ends (a nested one shares it), and a stop it swallowed
    or wrapped comes out as ``RunStopped``. A ``GeneratorExit`` (the caller stopped reading a
    framework's stream) passes as it is."""
    with outermost(run) as closes_step:
        try:
            yield
        except (RunStopped, GeneratorExit):
            raise
        except BaseException as exc:
            _swallowed(run, exc)
            raise
        finally:
            if closes_step:
                end_inferred_step(run)
    _swallowed(run, None)


def in_run(agent: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a framework's sync run ``fn`` attached to the active run, or as a new run ``agent``.

    A stop the framework caught is raised again as ``RunStopped`` once ``fn`` returns or raises
    its own exception; the step inferred inside the framework's run is closed when it ends
    (when the outermost one of the run ends, for a framework run nested in another).
    """
    run = active_run()
    if run is not None:
        with _framework_run(run):
            return fn(*args, **kwargs)
    if get_settings().disabled:
        return fn(*args, **kwargs)
    with RunScope(agent_spec(agent)):  # a run of its own, named after the agent
        return in_run(agent, fn, *args, **kwargs)


async def in_run_async(agent: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """:func:`in_run` for a coroutine function ``fn``."""
    run = active_run()
    if run is not None:
        with _framework_run(run):
            return await fn(*args, **kwargs)
    if get_settings().disabled:
        return await fn(*args, **kwargs)
    async with RunScope(agent_spec(agent)):
        return await in_run_async(agent, fn, *args, **kwargs)


# -- model calls -----------------------------------------------------------------------------
@dataclasses.dataclass(slots=True)
class Usage:
    """A model call's usage: ``input_tokens`` include cached ones, ``output_tokens`` the
    reasoning ones (GenAI conventions)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0


class ModelCall:
    """One guarded model call, from before the request to its recording (exactly once)."""

    __slots__ = ("_res", "done", "model", "operation", "run", "started_at", "step")

    def __init__(self, run: LiveRun, step: Step, model: str, operation: str, res: Any) -> None:
        self.run, self.step, self.model, self.operation = run, step, model, operation
        self._res = res
        self.started_at = time.time()
        self.done = False

    @contextlib.contextmanager
    def attached(self) -> Iterator[None]:
        """Around the request: the step's span is current and :data:`COUNTED_KEY` is set."""
        ctx = otel_context.set_value(COUNTED_KEY, True, self.step._ctx)
        token = otel_context.attach(ctx)
        try:
            yield
        finally:
            otel_context.detach(token)

    def _record(self, usage: Usage, response_id: str | None, error: BaseException | None) -> None:
        if self.done:
            return
        self.done = True
        res, token = self._res, None
        if res is not None:  # model_call settles the reservation of this context
            token = current_reservation.set(res)
        try:
            record_integrated(  # the code's own step.model_call of it is then the same call
                self.step,
                response_id,
                usage.input_tokens,
                usage.output_tokens,
                model=self.model,
                cached_tokens=usage.cached_tokens,
                reasoning_tokens=usage.reasoning_tokens,
                operation=self.operation,
                error=error,
                started_at=self.started_at,
            )
            note_integrated(self.run, response_id, usage.input_tokens, usage.output_tokens)
        finally:
            if token is not None:
                current_reservation.reset(token)
            if res is not None:
                res.__exit__(None, None, None)  # released unless the call settled it

    def finish(self, usage: Usage | None, response_id: str | None = None) -> None:
        """Record the call's usage and response id (once). ``RunStopped`` when a cancel landed
        while it was in flight (the call is recorded first)."""
        try:
            self._record(usage or Usage(), response_id, None)
        except RunStopped:
            raise
        except Exception:
            note_error("recording a model call")

    def fail(self, exc: BaseException) -> None:
        """The call raised: a model error is recorded (``model_error`` if it ends the run); a
        stop or a task cancellation only releases the reservation."""
        if isinstance(exc, RunStopped | BaseExceptionGroup) or not isinstance(exc, Exception):
            self.abandon()
            return
        try:
            self._record(Usage(), None, exc)
        except RunStopped:
            pass  # the model's error is what the caller sees; the stop is raised next call
        except Exception:
            note_error("recording a failed model call")

    def abandon(self) -> None:
        """Never finished (a stream dropped unread): release the reservation, record nothing."""
        if self.done:
            return
        self.done = True
        res = self._res
        if res is not None:
            with contextlib.suppress(Exception):
                res.__exit__(None, None, None)


def _reservation(run: LiveRun, model: str, max_tokens: int | None, prompt: Prompt | None) -> Any:
    """The whole request, held before it leaves: its prompt at the model's input rate and
    the output it may take (``_estimate.output_tokens``) at the output rate."""
    max_tokens = max_tokens if max_tokens is not None and max_tokens > 0 else None
    input_tokens = None
    try:
        input_tokens = None if prompt is None else prompt_tokens(model, prompt)
    except Exception:  # still guarded: the output alone is reserved
        note_error("estimating a model request's prompt")
    if input_tokens is None and max_tokens is None:
        return None  # nothing to estimate from: usage is reported after the call
    out = output_tokens(run, model, max_tokens)
    return make_reservation(
        run, None, None, model, input_tokens=input_tokens or 0, output_tokens=out
    )


def _held(res: Any) -> Any:
    # Entered for the checks and the hold, but not left in the caller's context: the call that
    # settles it may finish in another one (a stream read later); _record sets it around it.
    current_reservation.reset(res._token)
    res._token = None
    return res


@contextlib.contextmanager
def _or_unguarded(site: str) -> Iterator[None]:
    """A guard-side failure is logged and counted, and the block left (a stop goes through)."""
    try:
        yield
    except RunStopped:
        raise
    except Exception:
        note_error(site)


def _begin(
    run: LiveRun, model: str, max_tokens: int | None, prompt: Prompt | None
) -> tuple[Step, Any]:
    run.check_stop()  # a cancelled or stopped run: nothing more leaves
    return step_for(run, new_turn=True), _reservation(run, model, max_tokens, prompt)


def begin_call(
    run: LiveRun,
    is_async: bool,
    model: str,
    max_tokens: int | None = None,
    operation: str = "chat",
    prompt: Prompt | None = None,
) -> Body[ModelCall | None]:
    """Before a model call leaves: stop check, step, reservation of the request (its
    ``prompt``, what it sends, and its ``max_tokens`` or an estimate of its reply). A body
    of both forms (:mod:`._twins`): a wrapper's own body ``yield from``-s it.

    ``RunStopped`` when the run is cancelled or stopped, or the reservation cannot be covered;
    ``None`` when the guard side failed (the call then goes on unguarded; counted).
    """
    with _or_unguarded("guarding a model call"):
        step, res = _begin(run, model, max_tokens, prompt)
        if res is not None:
            entered = res.__enter__() if not is_async else (yield res.__aenter__())
            _held(entered)
        return ModelCall(run, step, model, operation, res)
    return None
