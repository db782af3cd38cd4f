"""The Pydantic AI capability that guards one agent run: model requests and tool calls.

:class:`GuardCapability` is added to every run by :mod:`guard.integrations.pydantic_ai` (the
framework's own extension point, so no private code path of the framework is patched):

* ``get_wrapper_model`` wraps the model that serves each request attempt in
  :class:`GuardedModel`, which counts it once (stop check, inferred step and reservation of the
  request before it leaves: its messages, instructions and tools, and its ``max_tokens``;
  usage and response id after), unless the call goes through an ``openai`` or
  ``anthropic`` client while that client's integration is on: that
  layer counts, reserves and stops it already, so it is left alone there (counted once).
* ``wrap_tool_execute`` admits each tool call before the tool runs (``RunStopped`` when the run
  is stopped or the tool quota is used up), records its fingerprint and result hash in-process
  for loop detection, and raises ``RunStopped`` when that call stopped the run: the result never
  reaches the model. ``RunStopped`` is not ``ModelRetry``, so the framework never turns it into
  a retry prompt; a ``ModelRetry`` from the tool is recorded as a failed call (the same failure
  again is no new information).
* ``wrap_node_run`` runs each node with :data:`~guard.integrations._base.COUNTED_KEY` in the
  OpenTelemetry context: the framework's own instrumentation starts its ``chat`` and
  ``execute_tool`` spans outside the model layer (its capability is the outermost one), and
  those spans are of calls counted here or at the model's client, so they are not counted
  again (by the SDK's span processor or the guard).
* ``wrap_run`` makes a cancel stop the framework's run at once when the guarded run's cancel
  cannot reach it by itself (a sync ``@guard.run`` around ``run_sync``, or a run driven by
  another task): it calls the framework's own ``RunContext.cancel()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
import weakref
from collections.abc import AsyncIterator
from typing import Any

from opentelemetry import context as otel_context
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.models.wrapper import WrapperModel

from guard.errors import RunStopped
from guard.integrations import enabled
from guard.integrations._base import (
    COUNTED_KEY,
    ModelCall,
    Prompt,
    Usage,
    active_run,
    admit_tool,
    begin_call,
    note_error,
)
from guard.integrations._twins import adrive

__all__ = ["GuardCapability", "GuardedModel"]


def _max_tokens(settings: Any) -> int | None:
    v = settings.get("max_tokens") if isinstance(settings, dict) else None
    return v if type(v) is int and v > 0 else None


def _prompt(messages: Any, params: Any) -> Prompt:
    """What the request sends: its messages (``ModelRequest`` / ``ModelResponse`` parts and
    instructions) and its tool definitions (function and output tools)."""
    tools = [
        *(getattr(params, "function_tools", None) or ()),
        *(getattr(params, "output_tools", None) or ()),
    ]
    return Prompt(messages, tools=tools or None)


def _int(v: Any) -> int:
    return v if type(v) is int and v >= 0 else 0


def _usage(u: Any) -> Usage | None:
    """Pydantic AI's ``RequestUsage``: input includes cached tokens, output the reasoning ones."""
    if u is None:
        return None
    reasoning = _int(getattr(u, "output_reasoning_tokens", 0))
    if not reasoning:
        details = getattr(u, "details", None)
        reasoning = _int(details.get("reasoning_tokens")) if isinstance(details, dict) else 0
    return Usage(
        input_tokens=_int(getattr(u, "input_tokens", 0)),
        output_tokens=_int(getattr(u, "output_tokens", 0)),
        cached_tokens=_int(getattr(u, "cache_read_tokens", 0)),
        reasoning_tokens=reasoning,
    )


def _finish(call: ModelCall, response: Any) -> None:
    rid = getattr(response, "provider_response_id", None)
    call.finish(_usage(getattr(response, "usage", None)), rid if isinstance(rid, str) else None)


# integration -> (its library, the client classes whose calls it guards)
_ANTHROPIC = ("Anthropic", "AsyncAnthropic", "AnthropicBedrock", "AsyncAnthropicBedrock")
_CLIENTS = {
    "openai": ("openai", ("OpenAI", "AsyncOpenAI")),
    "anthropic": ("anthropic", (*_ANTHROPIC, "AnthropicVertex", "AsyncAnthropicVertex")),
}


def _client_counts(model: Any) -> bool:
    """Whether a client integration (``openai``'s, ``anthropic``'s) guards this model's calls
    itself (counted there)."""
    clients: list[type] = []
    for name in enabled():
        library, names = _CLIENTS.get(name, ("", ()))
        module = sys.modules.get(library) if library else None
        clients += [c for c in (getattr(module, n, None) for n in names) if isinstance(c, type)]
    return bool(clients) and _calls_client(model, tuple(clients))


def _calls_client(model: Any, clients: tuple[type, ...]) -> bool:
    while isinstance(model, WrapperModel):
        model = model.wrapped
    inner = getattr(model, "models", None)  # FallbackModel: wrapped as a whole
    if isinstance(inner, list) and inner:
        # Only when every model calls a guarded client; a mixed chain is counted here, and its
        # guarded attempts once more underneath (a known limit: use the ModelFallback capability,
        # whose attempts are wrapped one by one).
        return all(_calls_client(m, clients) for m in inner)
    return isinstance(getattr(model, "client", None), clients)


class GuardedModel(WrapperModel):
    """The serving model of one request attempt, counted, reserved and stop-checked here."""

    async def _begin(self, messages: Any, settings: Any, params: Any) -> ModelCall | None:
        run = active_run()
        if run is None:
            return None
        name, max_tokens = self.model_name or "unknown", _max_tokens(settings)
        return await adrive(
            begin_call(run, True, name, max_tokens, prompt=_prompt(messages, params))
        )

    async def request(self, messages: Any, model_settings: Any, params: Any) -> Any:
        call = await self._begin(messages, model_settings, params)
        if call is None:
            return await self.wrapped.request(messages, model_settings, params)
        try:
            with call.attached():
                response = await self.wrapped.request(messages, model_settings, params)
        except BaseException as exc:
            call.fail(exc)
            raise
        _finish(call, response)
        return response

    @contextlib.asynccontextmanager
    async def request_stream(
        self, messages: Any, model_settings: Any, params: Any, run_context: Any = None
    ) -> AsyncIterator[Any]:
        call = await self._begin(messages, model_settings, params)
        if call is None:
            async with self.wrapped.request_stream(
                messages, model_settings, params, run_context
            ) as stream:
                yield stream
            return
        stream = None  # bound by the async with before it is read
        try:
            with call.attached():
                async with self.wrapped.request_stream(
                    messages, model_settings, params, run_context
                ) as stream:
                    yield stream
        except BaseException as exc:
            call.fail(exc)  # a cancel or a stop only releases the reservation
            raise
        try:
            response = stream.get()
        except Exception:
            note_error("reading a pydantic-ai stream's response")
            call.abandon()
            return
        _finish(call, response)


def _call_args(call: Any) -> Any:
    # The model's own arguments (JSON text or a dict), not the validated objects: the
    # fingerprint canonicalises them, and only its HMAC leaves the process.
    return getattr(call, "args", None)


@dataclasses.dataclass
class GuardCapability(AbstractCapability[Any]):
    """Guards one Pydantic AI run (added by ``guard.instrument("pydantic_ai")``)."""

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # never part of an agent spec: it is added at run time

    def get_wrapper_model(self, model: Any) -> Any:
        if active_run() is None or _client_counts(model):
            return None
        return GuardedModel(model)

    async def wrap_run(self, ctx: Any, *, handler: Any) -> Any:
        run = active_run()
        if run is not None and run.task is not asyncio.current_task():
            # The guarded run cannot cancel this task: let a cancel cancel the framework's run.
            ref = weakref.ref(ctx)

            def cancel() -> None:
                c = ref()
                if c is not None:
                    c.cancel()

            run.on_cancel(cancel)
        return await handler()

    async def wrap_node_run(self, ctx: Any, *, node: Any, handler: Any) -> Any:
        token = otel_context.attach(otel_context.set_value(COUNTED_KEY, True))
        try:
            return await handler(node)
        finally:
            otel_context.detach(token)

    async def wrap_tool_execute(
        self, ctx: Any, *, call: Any, tool_def: Any, args: Any, handler: Any
    ) -> Any:
        run = active_run()
        if run is None:
            return await handler(args)
        try:
            tc = admit_tool(getattr(call, "tool_name", "tool"), _call_args(call), run)
        except RunStopped:
            raise  # refused: the tool does not run, and the stop leaves the framework's run
        except Exception:
            note_error("admitting a pydantic-ai tool call")
            return await handler(args)
        assert tc is not None  # admitted in a run
        call_id = getattr(call, "tool_call_id", None)
        try:
            with tc.running(call_id):
                result = await handler(args)
        except RunStopped:
            tc.release()
            raise
        except Exception as exc:  # ModelRetry (ToolRetryError) included
            tc.failed(exc, call_id=call_id)
            run.check_stop()  # a stop this failure reached: no retry prompt for the model
            raise
        tc.done(result, call_id=call_id)
        run.check_stop()  # a stop this call reached (a loop): its result never reaches the model
        return result
