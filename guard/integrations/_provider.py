"""What the model client integrations (``openai``, ``anthropic``) have in common.

Both clients are guarded by one wrapper (:func:`guard.integrations._client.wrap_method`), and
both read a request and record a result the same way: the tool calls the request's
conversation carries are noted, its model, max tokens and prompt are reserved, and what the
method returns is a ``Stream`` / ``AsyncStream`` (wrapped, recorded when it ends), a raw
response (recorded when parsed) or a parsed body (recorded now, with its usage and response
id). A :class:`ClientIntegration` does that; an integration says only what differs: its
client's stream classes, where a request puts its max tokens, how its usage reads, how a
stream's items are read (a :class:`~guard.integrations._client.Reader`), and which errors
mean the request left.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from guard.integrations._base import ModelCall, Usage
from guard.integrations._client import (
    GuardedAsyncStream,
    GuardedRaw,
    GuardedStream,
    Reader,
    Request,
    wrap_method,
)
from guard.integrations._conversation import note_response, note_tools
from guard.integrations._estimate import request_prompt
from guard.sdk._run import LiveRun

__all__ = ["ClientIntegration"]


class ClientIntegration:
    """One API of a model client (``api``: how :mod:`guard.integrations._conversation` reads
    its requests and responses), guarded; ``operation`` names its calls on the record."""

    def __init__(self, api: str, operation: str = "chat") -> None:
        self.api, self.operation = api, operation

    # -- what an integration says ------------------------------------------------------------
    def streams(self) -> tuple[type, type]:
        """The client's ``Stream`` and ``AsyncStream`` classes (imported when first asked:
        the client library is imported only once the integration is on)."""
        raise NotImplementedError

    def max_tokens(self, kw: dict[str, Any]) -> int | None:
        """The request's cap on its reply, if it sets one."""
        raise NotImplementedError

    def usage(self, u: Any) -> Usage | None:
        """A response's usage (object or dict) in the guard's terms."""
        raise NotImplementedError

    def reader(self, run: LiveRun, note: Any) -> Reader:
        """A fresh reader of one stream's items."""
        raise NotImplementedError

    def note(self, kw: dict[str, Any]) -> Any:
        """Called before the request leaves, and may adjust its keyword arguments; what it
        returns is handed to :meth:`reader` (e.g. "usage was asked for")."""
        return None

    def wire_errors(self) -> tuple[type[BaseException], ...] | None:
        """The client's errors of a request that left (see :func:`wrap_method`)."""
        return None

    # -- what they share ---------------------------------------------------------------------
    def wrap(self, orig: Callable[..., Any], *, is_async: bool) -> Callable[..., Any]:
        """``orig``, one of the client's resource methods, guarded."""
        return wrap_method(
            orig,
            is_async=is_async,
            prepare=self.prepare,
            after=self.after,
            wire_errors=self.wire_errors(),
        )

    def prepare(self, run: LiveRun, kw: dict[str, Any]) -> Request:
        """What the guard reads from a request (a ``Prepare``)."""
        note_tools(run, self.api, kw)  # the tools a hand-written loop ran since the last call
        note = self.note(kw)
        m = kw.get("model")
        model = m if isinstance(m, str) and m else "unknown"
        return Request(model, self.max_tokens(kw), self.operation, note, request_prompt(kw))

    def after(self, call: ModelCall, result: Any, note: Any, is_async: bool) -> Any:
        """What the caller gets for ``result`` (an ``After``)."""
        stream, astream = self.streams()
        if isinstance(result, stream):
            return GuardedStream(result, call, self.reader(call.run, note))
        if isinstance(result, astream):
            return GuardedAsyncStream(result, call, self.reader(call.run, note))
        if hasattr(result, "http_response") and hasattr(result, "parse"):  # recorded when parsed
            return GuardedRaw(result, lambda parsed: self.after(call, parsed, note, is_async))
        self.finish(call, result)
        return result

    def finish(self, call: ModelCall, parsed: Any) -> None:
        """Record ``call`` from its parsed response."""
        note_response(call.run, self.api, parsed)  # the tool calls it asks for are the run's own
        rid = getattr(parsed, "id", None)
        call.finish(
            self.usage(getattr(parsed, "usage", None)), rid if isinstance(rid, str) else None
        )
