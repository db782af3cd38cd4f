"""The ``anthropic`` client: Messages, sync and async, streaming and the ``.stream()`` helper.

``enable()`` wraps ``create``, ``parse`` and ``stream`` of ``Messages`` and ``AsyncMessages``,
and of their beta twins (``client.beta.messages``, which LangChain's ``ChatAnthropic`` calls
when betas are set, and Pydantic AI's Anthropic model always), so every client is covered,
including clients made before ``guard.instrument()``. Inside a ``@guard.run`` each call is
guarded by :mod:`guard.integrations._base` the way the ``openai`` integration guards its
client (the same wrapper and the same reading of requests and results,
:mod:`guard.integrations._provider`): a stop
check and an inferred step before the request leaves, the request's prompt (``system``,
``messages``, ``tools``) and its ``max_tokens`` (which Anthropic requires) reserved, the
usage and the response id (``msg_...``) recorded once. A stream (``stream=True``, or the
``messages.stream(...)`` helper, whose ``text_stream``, ``until_done()`` and
``get_final_message()`` read the same guarded stream) raises ``RunStopped`` at the next
event after a cancel and closes the HTTP response.
``with_raw_response`` and ``with_streaming_response`` are recorded when their body is parsed.

Usage, mapped to the guard's (GenAI) meaning, where input tokens are the whole prompt::

    input_tokens     = usage.input_tokens + cache_read_input_tokens + cache_creation_input_tokens
    cached_tokens    = cache_read_input_tokens
    output_tokens    = usage.output_tokens
    reasoning_tokens = usage.output_tokens_details.thinking_tokens   (inside output_tokens)

Anthropic's ``input_tokens`` leave out the tokens read from and written to the prompt cache,
so both are added back (cached <= input holds); a cache write is counted as input (it is
prompt the model processed; the price book prices it as input). This is also what the
client's own OpenTelemetry span reports as ``gen_ai.usage.input_tokens``. A stream's usage
is its ``message_start`` usage updated by the counts its ``message_delta`` carries.

A hand-written tool loop needs no ``@guard.tool``: the ``tool_use`` blocks of the assistant
turns and the ``tool_result`` blocks the loop sends back are read from the request's
``messages`` (:mod:`guard.integrations._conversation`), fingerprinted in-process and fed to
loop detection, which stops the run before the request leaves.

Outside a run the call is untouched: a plain client is not an agent.
"""

from __future__ import annotations

import functools
from typing import Any

from guard.integrations._base import Usage, note_error
from guard.integrations._client import Patches, count, field
from guard.integrations._conversation import note_asked
from guard.integrations._provider import ClientIntegration

__all__ = ["LIBRARY", "NAME", "disable", "enable", "usage"]

NAME = "anthropic"
LIBRARY = "anthropic"

_patched = Patches()


def enable() -> None:
    """Wrap the Messages resource classes, and the beta ones (idempotent)."""
    if _patched:
        return
    from anthropic.resources.beta.messages.messages import AsyncMessages as AsyncBetaMessages
    from anthropic.resources.beta.messages.messages import Messages as BetaMessages
    from anthropic.resources.messages.messages import AsyncMessages, Messages

    for cls, is_async in (
        (Messages, False),
        (AsyncMessages, True),
        (BetaMessages, False),
        (AsyncBetaMessages, True),
    ):
        for attr in ("create", "parse"):
            _patched.replace(cls, attr, functools.partial(_MESSAGES.wrap, is_async=is_async))
        _patched.replace(cls, "stream", functools.partial(_wrap_helper, is_async=is_async))


def disable() -> None:
    """Restore the original methods."""
    _patched.restore()


# -- reading requests and responses -------------------------------------------------------------
def usage(u: Any) -> Usage | None:
    """An Anthropic ``Usage`` (object or dict) in the guard's terms (the module's mapping)."""
    if u is None:
        return None
    read, write = count(u, "cache_read_input_tokens"), count(u, "cache_creation_input_tokens")
    return Usage(
        input_tokens=count(u, "input_tokens") + read + write,
        output_tokens=count(u, "output_tokens"),
        cached_tokens=read,
        reasoning_tokens=count(field(u, "output_tokens_details"), "thinking_tokens"),
    )


_FIELDS = (
    "input_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "output_tokens",
    "output_tokens_details",
)


class _Reader:
    """Usage and response id of a Messages stream, from its raw events as they pass."""

    __slots__ = ("_fields", "response_id", "run")

    def __init__(self, run: Any) -> None:
        self.run = run
        self._fields: dict[str, Any] = {}
        self.response_id: str | None = None

    @property
    def usage(self) -> Usage | None:
        return usage(self._fields) if self._fields else None

    def _take(self, u: Any) -> None:
        for name in _FIELDS:  # a delta's counts are cumulative; an absent one keeps its value
            v = field(u, name)
            if v is not None:
                self._fields[name] = v

    def see(self, event: Any) -> bool:
        kind = getattr(event, "type", None)
        if kind == "message_start":
            msg = getattr(event, "message", None)
            rid = getattr(msg, "id", None)
            if isinstance(rid, str):
                self.response_id = rid
            self._take(getattr(msg, "usage", None))
        elif kind == "message_delta":
            self._take(getattr(event, "usage", None))
        elif kind == "content_block_start":
            block = getattr(event, "content_block", None)
            if getattr(block, "type", None) == "tool_use":  # the run's own call, from its id
                note_asked(self.run, getattr(block, "id", None), getattr(block, "name", None))
        return True


class _Messages(ClientIntegration):
    """The Messages API (``messages`` and ``beta.messages``)."""

    def streams(self) -> tuple[type, type]:
        from anthropic import AsyncStream, Stream

        return Stream, AsyncStream

    def max_tokens(self, kw: dict[str, Any]) -> int | None:
        mt = kw.get("max_tokens")  # required by Anthropic: reserved with the prompt
        return mt if type(mt) is int and mt > 0 else None

    def usage(self, u: Any) -> Usage | None:
        return usage(u)  # the module's, looked up at each call

    def reader(self, run: Any, note: Any) -> _Reader:
        return _Reader(run)

    def wire_errors(self) -> tuple[type[BaseException], ...]:
        # A ValueError the client raises before sending (e.g. "Streaming is required for
        # operations that may take longer than 10 minutes", which Pydantic AI answers by
        # streaming) is no model call; an APIError is one that left.
        from anthropic import APIError

        return (APIError,)


_MESSAGES = _Messages("anthropic")


def _wrap_helper(orig: Any, *, is_async: bool) -> Any:
    """``messages.stream(...)``: the helper makes its request when it is entered; that request
    becomes a guarded call (checked, reserved, recorded, cancel-aware) made then, in the
    context it is entered in, with the helper's own arguments."""

    @functools.wraps(orig)
    def stream(self: Any, *args: Any, **kwargs: Any) -> Any:
        returned = orig(self, *args, **kwargs)
        try:
            _rewire(returned, is_async, kwargs)
        except Exception:
            note_error("guarding an anthropic stream helper")  # it goes on unguarded
        return returned

    stream.__guard_original__ = orig  # type: ignore[attr-defined]
    return stream


def _rewire(returned: Any, is_async: bool, kwargs: dict[str, Any]) -> None:
    """Make the helper's request, when it is entered, a guarded call with ``kwargs``."""
    manager = _manager(returned, is_async)
    # the manager keeps the request it makes on entering in a private (name-mangled)
    # attribute; it is replaced by the guarded call, so the helper's stream is the guarded one
    attr = f"_{type(manager).__name__}__api_request"
    request = vars(manager).get(attr) if manager is not None else None
    if request is None:  # another client version: left unguarded, never broken
        return
    if is_async:

        async def send(_self: Any, **_kw: Any) -> Any:
            return await request

        async def guarded_request() -> Any:
            try:
                return await _MESSAGES.wrap(send, is_async=True)(None, **kwargs)
            finally:
                request.close()  # a refused call never sent it: no "never awaited" warning

        setattr(manager, attr, guarded_request())
    else:
        guarded = _MESSAGES.wrap(lambda _self, **_kw: request(), is_async=False)
        setattr(manager, attr, functools.partial(guarded, None, **kwargs))


def _manager(obj: Any, is_async: bool) -> Any:
    """The client's own stream manager (of ``messages`` or ``beta.messages``) in what
    ``stream()`` returned: itself, or the one an instrumentation that wrapped ``stream``
    before ``guard.instrument()`` wrapped in turn (OpenLLMetry's ``WrappedMessageStreamManager``
    keeps it as ``_stream_manager``)."""
    from anthropic.lib.streaming import (
        AsyncMessageStreamManager,
        BetaAsyncMessageStreamManager,
        BetaMessageStreamManager,
        MessageStreamManager,
    )

    classes = (
        (AsyncMessageStreamManager, BetaAsyncMessageStreamManager)
        if is_async
        else (MessageStreamManager, BetaMessageStreamManager)
    )
    for _ in range(4):
        if type(obj) in classes:
            return obj
        held = vars(obj) if hasattr(obj, "__dict__") else {}
        obj = held.get("_stream_manager", getattr(obj, "__wrapped__", None))
        if obj is None:
            return None
    return None
