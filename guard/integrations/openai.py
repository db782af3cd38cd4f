"""The ``openai`` client: chat completions and responses, sync and async, streaming included.

``enable()`` wraps ``create`` and ``parse`` of the resource classes (``Completions``,
``AsyncCompletions``, ``Responses``, ``AsyncResponses``), so every client is covered, including
clients made before ``guard.instrument()``; the ``.stream()`` helpers call ``create``. Inside a
``@guard.run`` each call is guarded by :mod:`guard.integrations._base`: a stop check and an
inferred step before the request leaves, the whole request reserved (its ``messages`` /
``input``, ``instructions`` and ``tools``, and its max tokens or an estimate of the reply:
:mod:`guard.integrations._estimate`), the usage and the response id recorded once. A stream is wrapped: it raises ``RunStopped`` at the next chunk
after a cancel and closes the HTTP response. A chat stream asks the server for its usage
(``stream_options.include_usage``) unless the caller set ``stream_options``; the extra usage
chunk is then consumed here, so the caller's iteration is unchanged.

Outside a run the call is untouched: a plain client is not an agent.
"""

from __future__ import annotations

import functools
from typing import Any

from guard.integrations._base import ModelCall, Usage
from guard.integrations._client import (
    GuardedAsyncStream,
    GuardedRaw,
    GuardedStream,
    Patches,
    Request,
    count,
    wrap_method,
)
from guard.integrations._conversation import note_asked, note_response, note_tools
from guard.integrations._estimate import request_prompt

__all__ = ["LIBRARY", "NAME", "disable", "enable"]

NAME = "openai"
LIBRARY = "openai"

_patched = Patches()
_OPERATION = {"chat": "chat", "responses": "responses"}
_DONE_EVENTS = ("response.completed", "response.incomplete", "response.failed")


def enable() -> None:
    """Wrap the resource classes (idempotent)."""
    if _patched:
        return
    from openai.resources.chat.completions import completions as chat
    from openai.resources.responses import responses

    for cls, api, is_async in (
        (chat.Completions, "chat", False),
        (chat.AsyncCompletions, "chat", True),
        (responses.Responses, "responses", False),
        (responses.AsyncResponses, "responses", True),
    ):
        for attr in ("create", "parse"):
            _patched.replace(cls, attr, functools.partial(_wrap, api=api, is_async=is_async))


def disable() -> None:
    """Restore the original methods."""
    _patched.restore()


# -- reading requests and responses -------------------------------------------------------------
def _max_tokens(api: str, kw: dict[str, Any]) -> int | None:
    names = (
        ("max_output_tokens",) if api == "responses" else ("max_completion_tokens", "max_tokens")
    )
    for n in names:
        v = kw.get(n)
        if type(v) is int and v > 0:
            return v
    return None


def _ask_for_usage(api: str, kw: dict[str, Any]) -> bool:
    """A chat stream reports usage only when asked; ask unless the caller chose options."""
    if api != "chat" or kw.get("stream") is not True or isinstance(kw.get("stream_options"), dict):
        return False
    kw["stream_options"] = {"include_usage": True}
    return True


def _usage(api: str, u: Any) -> Usage | None:
    if u is None:
        return None
    if api == "chat":
        return Usage(
            input_tokens=count(u, "prompt_tokens"),
            output_tokens=count(u, "completion_tokens"),
            cached_tokens=count(getattr(u, "prompt_tokens_details", None), "cached_tokens"),
            reasoning_tokens=count(
                getattr(u, "completion_tokens_details", None), "reasoning_tokens"
            ),
        )
    return Usage(
        input_tokens=count(u, "input_tokens"),
        output_tokens=count(u, "output_tokens"),
        cached_tokens=count(getattr(u, "input_tokens_details", None), "cached_tokens"),
        reasoning_tokens=count(getattr(u, "output_tokens_details", None), "reasoning_tokens"),
    )


def _finish(call: ModelCall, api: str, parsed: Any) -> None:
    note_response(call.run, api, parsed)  # the tool calls it asks for are the run's own
    rid = getattr(parsed, "id", None)
    call.finish(_usage(api, getattr(parsed, "usage", None)), rid if isinstance(rid, str) else None)


class _Reader:
    """Usage and response id of a stream, from its chunks / events as they pass."""

    __slots__ = ("api", "asked", "response_id", "run", "usage")

    def __init__(self, api: str, asked: bool, run: Any) -> None:
        self.api, self.asked, self.run = api, asked, run
        self.usage: Usage | None = None
        self.response_id: str | None = None

    def see(self, item: Any) -> bool:
        """Note one item; ``False`` for the usage chunk only this integration asked for."""
        if self.api == "chat":
            if self.response_id is None and isinstance(getattr(item, "id", None), str):
                self.response_id = item.id
            for choice in getattr(item, "choices", None) or ():
                delta = getattr(choice, "delta", None)
                for c in getattr(delta, "tool_calls", None) or ():  # its id: in its first delta
                    note_asked(self.run, getattr(c, "id", None))
            u = getattr(item, "usage", None)
            if u is not None:
                self.usage = _usage("chat", u)
                if self.asked and not getattr(item, "choices", None):
                    return False
            return True
        kind = getattr(item, "type", None)
        if kind == "response.created" or kind in _DONE_EVENTS:
            resp = getattr(item, "response", None)
            rid = getattr(resp, "id", None)
            if isinstance(rid, str):
                self.response_id = rid
            if kind in _DONE_EVENTS:
                self.usage = _usage("responses", getattr(resp, "usage", None))
                note_response(self.run, "responses", resp)
        return True


def _after(call: ModelCall, api: str, result: Any, asked: bool, is_async: bool) -> Any:
    from openai import AsyncStream, Stream

    if isinstance(result, Stream):
        return GuardedStream(result, call, _Reader(api, asked, call.run))
    if isinstance(result, AsyncStream):
        return GuardedAsyncStream(result, call, _Reader(api, asked, call.run))
    if hasattr(result, "http_response") and hasattr(result, "parse"):  # recorded when parsed
        return GuardedRaw(result, lambda parsed: _after(call, api, parsed, asked, is_async))
    _finish(call, api, result)
    return result


def _model(kw: dict[str, Any]) -> str:
    m = kw.get("model")
    return m if isinstance(m, str) and m else "unknown"


def _wrap(orig: Any, *, api: str, is_async: bool) -> Any:
    def prepare(run: Any, kw: dict[str, Any]) -> Request:
        note_tools(run, api, kw)  # the tools a hand-written loop ran since the last call
        asked = _ask_for_usage(api, kw)
        return Request(_model(kw), _max_tokens(api, kw), _OPERATION[api], asked, request_prompt(kw))

    def after(call: ModelCall, result: Any, asked: Any, is_async: bool) -> Any:
        return _after(call, api, result, asked, is_async)

    return wrap_method(orig, is_async=is_async, prepare=prepare, after=after)
