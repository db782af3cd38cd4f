"""The ``openai`` client: chat completions and responses, sync and async, streaming included.

``enable()`` wraps ``create`` and ``parse`` of the resource classes (``Completions``,
``AsyncCompletions``, ``Responses``, ``AsyncResponses``), so every client is covered, including
clients made before ``guard.instrument()``; the ``.stream()`` helpers call ``create``. Inside a
``@guard.run`` each call is guarded by :mod:`guard.integrations._base`: a stop check and an
inferred step before the request leaves, the request's max tokens reserved, the usage and the
response id recorded once. A stream is wrapped: it raises ``RunStopped`` at the next chunk
after a cancel and closes the HTTP response. A chat stream asks the server for its usage
(``stream_options.include_usage``) unless the caller set ``stream_options``; the extra usage
chunk is then consumed here, so the caller's iteration is unchanged.

Outside a run the call is untouched: a plain client is not an agent.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from guard.errors import RunStopped
from guard.integrations._base import (
    ModelCall,
    Usage,
    abegin_model_call,
    active_run,
    begin_model_call,
    note_error,
)
from guard.integrations._conversation import note_tools

__all__ = ["LIBRARY", "NAME", "disable", "enable"]

NAME = "openai"
LIBRARY = "openai"

_patched: list[tuple[type, str, Any]] = []  # (class, attribute, original)
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
            orig = cls.__dict__.get(attr)
            if orig is None:
                continue
            wrap = _wrap_async if is_async else _wrap_sync
            setattr(cls, attr, wrap(orig, api))
            _patched.append((cls, attr, orig))


def disable() -> None:
    """Restore the original methods."""
    while _patched:
        cls, attr, orig = _patched.pop()
        setattr(cls, attr, orig)


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


def _int(obj: Any, name: str) -> int:
    v = getattr(obj, name, None) if obj is not None else None
    return v if type(v) is int and v >= 0 else 0


def _usage(api: str, u: Any) -> Usage | None:
    if u is None:
        return None
    if api == "chat":
        return Usage(
            input_tokens=_int(u, "prompt_tokens"),
            output_tokens=_int(u, "completion_tokens"),
            cached_tokens=_int(getattr(u, "prompt_tokens_details", None), "cached_tokens"),
            reasoning_tokens=_int(
                getattr(u, "completion_tokens_details", None), "reasoning_tokens"
            ),
        )
    return Usage(
        input_tokens=_int(u, "input_tokens"),
        output_tokens=_int(u, "output_tokens"),
        cached_tokens=_int(getattr(u, "input_tokens_details", None), "cached_tokens"),
        reasoning_tokens=_int(getattr(u, "output_tokens_details", None), "reasoning_tokens"),
    )


def _finish(call: ModelCall, api: str, parsed: Any) -> None:
    rid = getattr(parsed, "id", None)
    call.finish(_usage(api, getattr(parsed, "usage", None)), rid if isinstance(rid, str) else None)


class _GuardedRaw:
    """A raw response (``with_raw_response`` / ``with_streaming_response``): everything is the
    client's own, but ``parse()`` hands the parsed body to the guard once, so a stream comes
    back guarded and a plain body's usage is recorded. ``parse()`` is a coroutine for the async
    client's streaming responses (awaited here, never left pending) but not for its
    ``with_raw_response`` (the client's legacy response type): the type says which."""

    def __init__(self, raw: Any, call: ModelCall, api: str, asked: bool, is_async: bool) -> None:
        self._raw, self._call, self._api, self._asked = raw, call, api, asked
        self._is_async = is_async
        self._async_parse = inspect.iscoroutinefunction(getattr(type(raw), "parse", None))
        self._guarded: Any = _UNSET

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)

    def parse(self, **kwargs: Any) -> Any:
        if self._async_parse:
            return self._aparse(**kwargs)
        return self._guard(self._raw.parse(**kwargs))

    async def _aparse(self, **kwargs: Any) -> Any:
        return self._guard(await self._raw.parse(**kwargs))

    def _guard(self, parsed: Any) -> Any:
        if self._guarded is _UNSET:  # the client caches parse(): so does this, once guarded
            self._guarded = _after(self._call, self._api, parsed, self._asked, self._is_async)
        return self._guarded


_UNSET = object()


class _Reader:
    """Usage and response id of a stream, from its chunks / events as they pass."""

    __slots__ = ("api", "asked", "response_id", "usage")

    def __init__(self, api: str, asked: bool) -> None:
        self.api, self.asked = api, asked
        self.usage: Usage | None = None
        self.response_id: str | None = None

    def see(self, item: Any) -> bool:
        """Note one item; ``False`` for the usage chunk only this integration asked for."""
        if self.api == "chat":
            if self.response_id is None and isinstance(getattr(item, "id", None), str):
                self.response_id = item.id
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
        return True


_OWN = frozenset({"_stream", "_call", "_reader", "_it"})


class _Guarded:
    """What both stream wrappers share: the wrapped stream's attributes, the one recording."""

    def __init__(self, stream: Any, call: ModelCall, reader: _Reader) -> None:
        self._stream, self._call, self._reader = stream, call, reader

    def __getattr__(self, name: str) -> Any:
        if name in _OWN:  # not set yet (a failed __init__): never recurse
            raise AttributeError(name)
        return getattr(self._stream, name)

    # A wrapper around the client's method that was installed before guard.instrument()
    # (OpenLLMetry's) tells a stream from a response with isinstance(result, Stream): the
    # wrapped stream's class is what that sees (as wrapt's proxies do), else it takes the
    # stream for a response and fails on it inside the user's call.
    @property  # type: ignore[misc]
    def __class__(self) -> type:  # type: ignore[override]
        return self._stream.__class__

    def _record(self) -> None:
        if not self._call.done:
            self._call.finish(self._reader.usage, self._reader.response_id)

    def _raise_stop(self, cause: BaseException | None) -> None:
        self._record()
        try:
            self._call.run.check_stop()
        except RunStopped as stop:
            raise stop from cause

    def __del__(self) -> None:
        call = getattr(self, "_call", None)
        if call is not None:
            call.abandon()  # dropped unread: free the reservation


class _GuardedStream(_Guarded):
    """A sync ``Stream`` that records its call at the end and stops on a cancel."""

    def __init__(self, stream: Any, call: ModelCall, reader: _Reader) -> None:
        super().__init__(stream, call, reader)
        self._it = iter(stream)

    def __iter__(self) -> _GuardedStream:
        return self

    def _stop(self, cause: BaseException | None = None) -> None:
        """A cancel reached the stream: close the HTTP response, record, raise RunStopped."""
        try:
            self._stream.close()
        except Exception:
            note_error("closing an openai stream")
        self._raise_stop(cause)

    def __next__(self) -> Any:
        run = self._call.run
        while True:
            if run._interrupt is not None:
                self._stop()
            try:
                item = next(self._it)
            except StopIteration:
                if run._interrupt is not None:
                    self._stop()
                self._record()
                raise
            except RunStopped:
                raise
            except Exception as exc:
                if run._interrupt is not None:
                    self._stop(exc)
                self._call.fail(exc)
                raise
            if self._reader.see(item):
                return item

    def close(self) -> None:
        self._stream.close()
        self._record()

    def __enter__(self) -> _GuardedStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _GuardedAsyncStream(_Guarded):
    """An ``AsyncStream`` that records its call at the end and stops on a cancel (the run's
    task is cancelled by the SDK; the response is closed on the way out)."""

    def __init__(self, stream: Any, call: ModelCall, reader: _Reader) -> None:
        super().__init__(stream, call, reader)
        self._it = stream.__aiter__()

    def __aiter__(self) -> _GuardedAsyncStream:
        return self

    async def _stop(self, cause: BaseException | None = None) -> None:
        try:
            await self._stream.close()
        except Exception:
            note_error("closing an openai stream")
        self._raise_stop(cause)

    async def __anext__(self) -> Any:
        run = self._call.run
        while True:
            if run._interrupt is not None:
                await self._stop()
            try:
                item = await self._it.__anext__()
            except StopAsyncIteration:
                if run._interrupt is not None:
                    await self._stop()
                self._record()
                raise
            except RunStopped:
                raise
            except BaseException as exc:
                if run._interrupt is not None:
                    await self._stop(exc)
                if isinstance(exc, Exception):
                    self._call.fail(exc)
                else:  # cancelled from outside: close the response, keep what was seen
                    await self._stream.close()
                    self._call.abandon()
                raise
            if self._reader.see(item):
                return item

    async def close(self) -> None:
        await self._stream.close()
        self._record()

    async def __aenter__(self) -> _GuardedAsyncStream:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


def _after(call: ModelCall, api: str, result: Any, asked: bool, is_async: bool) -> Any:
    from openai import AsyncStream, Stream

    if isinstance(result, Stream):
        return _GuardedStream(result, call, _Reader(api, asked))
    if isinstance(result, AsyncStream):
        return _GuardedAsyncStream(result, call, _Reader(api, asked))
    if hasattr(result, "http_response") and hasattr(result, "parse"):
        return _GuardedRaw(result, call, api, asked, is_async)  # recorded when parsed
    _finish(call, api, result)
    return result


def _model(kw: dict[str, Any]) -> str:
    m = kw.get("model")
    return m if isinstance(m, str) and m else "unknown"


def _wrap_sync(orig: Callable[..., Any], api: str) -> Callable[..., Any]:
    @functools.wraps(orig)
    def call_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        run = active_run()
        if run is None:
            return orig(self, *args, **kwargs)
        note_tools(run, api, kwargs)  # the tools a hand-written loop ran since the last call
        asked = _ask_for_usage(api, kwargs)
        call = begin_model_call(
            run,
            model=_model(kwargs),
            max_tokens=_max_tokens(api, kwargs),
            operation=_OPERATION[api],
        )
        if call is None:
            return orig(self, *args, **kwargs)
        try:
            with call.attached():
                result = orig(self, *args, **kwargs)
        except BaseException as exc:
            call.fail(exc)
            raise
        return _after(call, api, result, asked, False)

    call_model.__guard_original__ = orig  # type: ignore[attr-defined]
    return call_model


def _wrap_async(orig: Callable[..., Any], api: str) -> Callable[..., Any]:
    @functools.wraps(orig)
    async def call_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        run = active_run()
        if run is None:
            return await orig(self, *args, **kwargs)
        note_tools(run, api, kwargs)
        asked = _ask_for_usage(api, kwargs)
        call = await abegin_model_call(
            run,
            model=_model(kwargs),
            max_tokens=_max_tokens(api, kwargs),
            operation=_OPERATION[api],
        )
        if call is None:
            return await orig(self, *args, **kwargs)
        try:
            with call.attached():
                result = await orig(self, *args, **kwargs)
        except BaseException as exc:
            call.fail(exc)
            raise
        return _after(call, api, result, asked, True)

    call_model.__guard_original__ = orig  # type: ignore[attr-defined]
    return call_model
