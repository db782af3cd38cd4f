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

from guard.integrations._base import Usage
from guard.integrations._client import Patches, count
from guard.integrations._conversation import note_asked, note_response
from guard.integrations._provider import ClientIntegration

__all__ = ["LIBRARY", "NAME", "disable", "enable"]

NAME = "openai"
LIBRARY = "openai"

_patched = Patches()
_DONE_EVENTS = ("response.completed", "response.incomplete", "response.failed")


class _OpenAI(ClientIntegration):
    """Chat completions (``api="chat"``) or responses (``api="responses"``)."""

    def streams(self) -> tuple[type, type]:
        from openai import AsyncStream, Stream

        return Stream, AsyncStream

    def max_tokens(self, kw: dict[str, Any]) -> int | None:
        names = (
            ("max_output_tokens",)
            if self.api == "responses"
            else ("max_completion_tokens", "max_tokens")
        )
        for n in names:
            v = kw.get(n)
            if type(v) is int and v > 0:
                return v
        return None

    def note(self, kw: dict[str, Any]) -> bool:
        """A chat stream reports usage only when asked; ask unless the caller chose options
        (``True``: asked here, so the usage chunk is not the caller's)."""
        if (
            self.api != "chat"
            or kw.get("stream") is not True
            or isinstance(kw.get("stream_options"), dict)
        ):
            return False
        kw["stream_options"] = {"include_usage": True}
        return True

    def usage(self, u: Any) -> Usage | None:
        return _usage(self.api, u)

    def reader(self, run: Any, note: Any) -> _Reader:
        return _Reader(self.api, note, run)


_APIS = {api: _OpenAI(api, api) for api in ("chat", "responses")}


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
            _patched.replace(cls, attr, functools.partial(_APIS[api].wrap, is_async=is_async))


def disable() -> None:
    """Restore the original methods."""
    _patched.restore()


# -- reading responses -------------------------------------------------------------------------
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
