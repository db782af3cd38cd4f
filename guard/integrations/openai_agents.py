"""The OpenAI Agents SDK (``agents``): runs, tools and a stop that really stops the run.

``enable()`` wraps four places of the library, so every agent, runner and tool is covered,
including those made before ``guard.instrument()``:

* ``AgentRunner.run``: ``Runner.run`` and ``Runner.run_sync`` (which drives ``run`` on its own
  event loop) run inside the active ``@guard.run``, or as a new run named after the starting
  agent (``Agent.name``) when none is active (:func:`guard.integrations._base.in_run_async`);
* the streamed run's loop (``agents.run.start_streaming``, the task ``Runner.run_streamed``
  starts): the same, inside that task, so a new run's cancel cancels that task and its stop
  comes out of ``RunResultStreaming.stream_events()`` as ``RunStopped``;
* the reader of a streamed run attached to a ``@guard.run`` (``stream_events``): that run's
  task is the reader's, so the guard's stop cancels the reader while it waits for events, and
  the library lets that ``CancelledError`` out; it comes out as ``RunStopped`` (with the run's
  reason) instead, once the run's loop has settled. The user's own cancel of the reader stays
  a ``CancelledError``;
* the function-tool invocation (``agents.run_internal.tool_execution``): each call is admitted
  before the tool runs and recorded after it (fingerprint and result hash, in-process) for
  loop detection. A refused call raises ``RunStopped`` *outside* ``FunctionTool.on_invoke_tool``
  (whose ``failure_error_function`` turns a tool's exception into a result the model reads),
  so it ends the run; and a stop reached inside a tool (a ``@guard.tool`` that refused, whose
  refusal the library turned into a result) is raised instead of that result.

Model calls: the library's OpenAI models call the ``openai`` client, and the ``openai``
integration counts, reserves and stop-checks them there, once (and infers a step per model
turn). This integration therefore turns the ``openai`` client layer on as its dependency when
it is not on already (``guard.instrument("openai_agents")`` alone counts model calls too), and
turns it off again only if it turned it on and nobody else asked for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable
from typing import Any

from guard.errors import RunStopped
from guard.integrations._base import active_run, admit_tool, in_run_async, note_error
from guard.integrations._framework_runs import swallowed
from guard.sdk._run import _task_cancels

__all__ = ["LIBRARY", "NAME", "disable", "enable"]

_NOTHING = contextlib.nullcontext()

NAME = "openai_agents"
LIBRARY = "agents"

_patched: list[tuple[Any, str, Any]] = []  # (owner, attribute, original)
_own_client_layer = False  # the openai client layer was turned on by this integration


def enable() -> None:
    """Wrap the runner, the streamed loop and its reader, and the tool invocation (idempotent)."""
    global _own_client_layer
    if _patched:
        return
    from agents import run as run_mod
    from agents.result import RunResultStreaming
    from agents.run_internal import tool_execution

    from guard.integrations import openai as client_layer

    seams = (
        (run_mod.AgentRunner, "run", _wrap_run),
        (run_mod, "start_streaming", _wrap_streaming),
        (RunResultStreaming, "stream_events", _wrap_stream_events),
        (tool_execution, "_invoke_function_tool_with_metadata", _wrap_tool),
    )
    # All looked up before anything is patched: a release that moved one of them leaves the
    # library as it was (instrument() reports it), never half wrapped.
    missing = [f"{getattr(o, '__name__', o)}.{a}" for o, a, _ in seams if not hasattr(o, a)]
    if missing:
        raise AttributeError(f"the Agents SDK has no {', '.join(missing)}")
    # The client layer has no "is on" query of its own: its list of patched methods is it.
    if not client_layer._patched:
        client_layer.enable()
        _own_client_layer = True
    for owner, attr, wrap in seams:
        orig = getattr(owner, attr)
        setattr(owner, attr, wrap(orig))
        _patched.append((owner, attr, orig))


def disable() -> None:
    """Restore the originals; the client layer too if this integration alone turned it on."""
    global _own_client_layer
    while _patched:
        owner, attr, orig = _patched.pop()
        setattr(owner, attr, orig)
    if _own_client_layer:
        _own_client_layer = False
        from guard import integrations
        from guard.integrations import openai as client_layer

        # Read without the registry's lock: disable() runs under it (uninstrument()).
        if "openai" not in integrations._on:
            client_layer.disable()


def _agent_name(agent: Any) -> str:
    name = getattr(agent, "name", None)
    return name if isinstance(name, str) and name else "openai-agent"


# -- runs ------------------------------------------------------------------------------------
def _wrap_run(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    async def run(self: Any, starting_agent: Any, input: Any, **kwargs: Any) -> Any:
        return await in_run_async(
            _agent_name(starting_agent), orig, self, starting_agent, input, **kwargs
        )

    run.__guard_original__ = orig  # type: ignore[attr-defined]
    return run


def _wrap_streaming(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    async def start_streaming(*args: Any, **kwargs: Any) -> Any:
        # Runs as the task run_streamed() started: the context (and the active run) is the
        # caller's, copied when the task was created; a new run's task is this one.
        return await in_run_async(_agent_name(kwargs.get("starting_agent")), orig, *args, **kwargs)

    start_streaming.__guard_original__ = orig  # type: ignore[attr-defined]
    return start_streaming


# How long a reader the guard stopped waits for the run's loop, which the library cancelled
# without waiting: a loop that ignores its cancel must not hold the user's stop up.
_SETTLE_S = 5.0


def _stopped_by_guard() -> bool:
    """Whether the cancellation this task is unwinding is the guard's: every cancel request
    pending on it is the SDK's own (a user's cancel of the task is one more)."""
    task = asyncio.current_task()
    if task is None:
        return False
    return task.cancelling() <= (1 if task in _task_cancels else 0)


async def _settle(result: Any) -> None:
    """Let the run's loop task finish (the library cancelled it when its reader was cancelled)
    so nothing of the run goes on once ``RunStopped`` is out; its exception, the same stop, is
    taken so that asyncio does not report it as never retrieved."""
    task = getattr(result, "run_loop_task", None)
    if not isinstance(task, asyncio.Task):
        return
    if not task.done():
        task.cancel()
        await asyncio.wait((task,), timeout=_SETTLE_S)
    if task.done() and not task.cancelled():
        task.exception()


def _wrap_stream_events(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    async def stream_events(self: Any, *args: Any, **kwargs: Any) -> Any:
        run = active_run()  # the reader's run: a streamed run attached to it shares its task
        events = orig(self, *args, **kwargs)
        try:
            async for event in events:
                yield event
        except (RunStopped, GeneratorExit):
            raise
        except asyncio.CancelledError as exc:
            if run is None or not _stopped_by_guard():
                raise
            try:
                await _settle(self)
            except Exception:
                note_error("settling a stopped openai-agents stream")
            swallowed(run, exc)
            raise
        except BaseException as exc:
            if run is not None:
                swallowed(run, exc)
            raise
        finally:
            await events.aclose()
        if run is not None:
            swallowed(run, None)

    stream_events.__guard_original__ = orig  # type: ignore[attr-defined]
    return stream_events


# -- tools -----------------------------------------------------------------------------------
def _stop_if_stopped(run: Any) -> None:
    """A cancel, or a stop raised inside the tool and swallowed by the library: raise it rather
    than hand the tool's result (or the library's error text) to the model."""
    if run.stopped is not None or run.cancelled:
        run.check_stop()


def _release(call: Any) -> None:
    """An admitted call that is not recorded here: give its quota slot back."""
    if call is not None:
        call.release()


def _wrap_tool(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    async def invoke(*, function_tool: Any, context: Any, arguments: Any, **kw: Any) -> Any:
        run = active_run()
        if run is None:
            return await orig(
                function_tool=function_tool, context=context, arguments=arguments, **kw
            )
        call = None
        call_id = getattr(context, "tool_call_id", None)
        try:
            call = admit_tool(getattr(function_tool, "name", "tool"), arguments, run)
        except RunStopped:
            raise  # refused: the tool does not run, and the stop ends the framework's run
        except Exception:
            note_error("admitting an openai-agents tool call")
        try:
            with call.running(call_id) if call is not None else _NOTHING:
                result = await orig(
                    function_tool=function_tool, context=context, arguments=arguments, **kw
                )
        except RunStopped:
            _release(call)
            raise
        except BaseException as exc:
            if call is not None and isinstance(exc, Exception):
                call.failed(exc, call_id=call_id)
            else:
                _release(call)
            _stop_if_stopped(run)
            raise
        if run.stopped is not None or run.cancelled:
            _release(call)  # its "result" is the library's text for a refusal, or moot
            run.check_stop()
        if call is not None:  # (released instead when a @guard.tool inside recorded it)
            call.done(getattr(result, "output", result), call_id=call_id)
        return result

    invoke.__guard_original__ = orig  # type: ignore[attr-defined]
    return invoke
