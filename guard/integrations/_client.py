"""A model client's methods, streams and raw responses, guarded (part of
:mod:`guard.integrations._base`).

The ``openai`` and ``anthropic`` clients share their shape: resource classes whose methods
take keyword arguments, a ``Stream`` / ``AsyncStream`` of server-sent events with ``close()``,
and raw responses whose ``parse()`` gives the body. So one wrapper serves both, and what
differs is said by the client's integration: how a request is read (:data:`Prepare`: the tools
its conversation carries, the model, the max tokens), what a result becomes (:data:`After`),
and how usage and the response id are read off a stream's items (a :class:`Reader`).

:func:`wrap_method` guards one method: outside a run it is the original call; inside, a stop
check, an inferred step and a reservation before the request leaves (``_base``), and the call
recorded once. A guarded stream records its call when it ends or is closed, raises
``RunStopped`` at the next item after a cancel (closing the HTTP response first), and releases
the reservation of a stream dropped unread.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from guard.errors import RunStopped
from guard.integrations._base import ModelCall, Usage, active_run, begin_call, note_error
from guard.integrations._twins import Body, adrive, drive
from guard.sdk._run import LiveRun

__all__ = [
    "After",
    "GuardedAsyncStream",
    "GuardedRaw",
    "GuardedStream",
    "Patches",
    "Prepare",
    "Reader",
    "Request",
    "count",
    "field",
    "wrap_method",
]


def field(obj: Any, name: str) -> Any:
    """``obj[name]`` of a dict (a request's params), else ``obj.name`` (a client's model), else
    ``None``."""
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def count(obj: Any, name: str) -> int:
    """A token counter of a usage object or dict: a non-negative int, else 0."""
    v = field(obj, name)
    return v if type(v) is int and v >= 0 else 0


class Request(NamedTuple):
    """What the guard reads from a request before it leaves."""

    model: str
    max_tokens: int | None
    operation: str
    note: Any = None  # the integration's own, handed to its After (e.g. "usage was asked for")
    prompt: Any = None  # what the request sends (an _estimate.Prompt), for its reservation


Args = tuple[Any, ...]
Kw = dict[str, Any]
# (run, the call's keyword arguments) -> Request; may record the tool calls the request's
# conversation carries (note_tools: RunStopped for a loop they complete) or adjust kwargs.
Prepare = Callable[[LiveRun, dict[str, Any]], Request]
# (call, what the method returned, Request.note, is_async) -> what the caller gets: the result
# recorded, or a stream / raw response wrapped to record it later.
After = Callable[[ModelCall, Any, Any, bool], Any]


def _read(prepare: Prepare, run: LiveRun, kwargs: dict[str, Any]) -> Request | None:
    try:
        return prepare(run, kwargs)
    except RunStopped:
        raise
    except Exception:
        note_error("reading a model request")  # the call goes on unguarded
        return None


def _handed_back(after: After, call: ModelCall, result: Any, note: Any, is_async: bool) -> Any:
    try:
        return after(call, result, note, is_async)
    except RunStopped:
        raise
    except Exception:
        note_error("recording a model call")  # the caller gets the client's own result
        call.abandon()
        return result


def wrap_method(
    orig: Callable[..., Any],
    *,
    is_async: bool,
    prepare: Prepare,
    after: After,
    wire_errors: tuple[type[BaseException], ...] | None = None,
) -> Callable[..., Any]:
    """``orig`` (a client resource's method), guarded inside a ``@guard.run``.

    ``wire_errors``: the client's errors of a request that left (its ``APIError``); anything
    else ``orig`` raises was raised by the client before the request left (an argument it
    refuses), which is no model call: its reservation is released and nothing is recorded.
    ``None``: every error is recorded as a failed model call."""
    how = _How(orig, is_async, prepare, after, wire_errors)
    if is_async:

        @functools.wraps(orig)
        async def acall_model(self: Any, *args: Any, **kwargs: Any) -> Any:
            run = active_run()
            if run is None:
                return await orig(self, *args, **kwargs)
            return await adrive(_call_model(how, run, self, args, kwargs))

        acall_model.__guard_original__ = orig  # type: ignore[attr-defined]
        return acall_model

    @functools.wraps(orig)
    def call_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        run = active_run()
        if run is None:
            return orig(self, *args, **kwargs)
        return drive(_call_model(how, run, self, args, kwargs))

    call_model.__guard_original__ = orig  # type: ignore[attr-defined]
    return call_model


class _How(NamedTuple):
    """What :func:`wrap_method` was given: one tuple, made once per wrapped method."""

    orig: Callable[..., Any]
    is_async: bool
    prepare: Prepare
    after: After
    wire_errors: tuple[type[BaseException], ...] | None


def _call_model(how: _How, run: LiveRun, self: Any, args: Args, kwargs: Kw) -> Body[Any]:
    """One guarded call of ``how.orig`` inside ``run``, both forms (:mod:`._twins`)."""
    is_async = how.is_async
    req = _read(how.prepare, run, kwargs)
    call = None
    if req is not None:
        call = yield from begin_call(
            run, is_async, req.model, req.max_tokens, req.operation, req.prompt
        )
    if call is None:  # req is None too, or the guard side failed: unguarded
        result = how.orig(self, *args, **kwargs)
        return (yield result) if is_async else result
    try:
        with call.attached():
            result = how.orig(self, *args, **kwargs)
            if is_async:
                result = yield result
    except BaseException as exc:
        if how.wire_errors is None or isinstance(exc, how.wire_errors):
            call.fail(exc)
        else:
            call.abandon()
        raise
    assert req is not None  # a call is only begun for a request read
    return _handed_back(how.after, call, result, req.note, is_async)


class Patches:
    """The methods an integration replaced, to put back on ``disable()``."""

    def __init__(self) -> None:
        self._done: list[tuple[type, str, Any]] = []  # (class, attribute, original)

    def __bool__(self) -> bool:
        return bool(self._done)

    def replace(self, cls: type, attr: str, wrap: Callable[[Any], Any]) -> None:
        """``cls.attr = wrap(original)``, when ``cls`` defines ``attr`` itself."""
        orig = cls.__dict__.get(attr)
        if orig is None:
            return
        setattr(cls, attr, wrap(orig if type(orig) is types.FunctionType else _bound(orig)))
        self._done.append((cls, attr, orig))

    def restore(self) -> None:
        while self._done:
            cls, attr, orig = self._done.pop()
            setattr(cls, attr, orig)


def _bound(descriptor: Any) -> Callable[..., Any]:
    """An attribute that is not a plain function, such as another instrumentation's wrapper
    (OpenLLMetry's ``wrapt`` function wrappers), is called bound to the instance, as the class
    would: called from the class with ``self`` as an argument, it sees no instance. (``type``,
    not ``isinstance``: a ``wrapt`` proxy passes itself off as the function it wraps.)"""

    @functools.wraps(descriptor)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        return descriptor.__get__(self, type(self))(*args, **kwargs)

    return call


class Reader(Protocol):
    """Usage and response id of a stream, read from its items as they pass."""

    response_id: str | None

    @property
    def usage(self) -> Usage | None:
        """What the stream's items said of its usage so far (``None``: nothing yet)."""
        ...

    def see(self, item: Any) -> bool:
        """Note one item; ``False`` for an item the caller must not see (one only the guard
        asked for)."""
        ...


class GuardedRaw:
    """A raw response (``with_raw_response`` / ``with_streaming_response``): everything is the
    client's own, but ``parse()`` hands the parsed body to ``guard_parsed`` once (which records
    a plain body's usage or wraps a stream). ``parse()`` is a coroutine for the async client's
    streaming responses (awaited here, never left pending) but not for its
    ``with_raw_response`` (the client's legacy response type): the type says which."""

    def __init__(self, raw: Any, guard_parsed: Callable[[Any], Any]) -> None:
        self._raw, self._guard_parsed = raw, guard_parsed
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
            self._guarded = self._guard_parsed(parsed)
        return self._guarded


_UNSET = object()
_OWN = frozenset({"_stream", "_call", "_reader", "_it"})


class _Guarded:
    """What both stream wrappers share: the wrapped stream's attributes, the one recording."""

    def __init__(self, stream: Any, call: ModelCall, reader: Reader) -> None:
        self._stream, self._call, self._reader = stream, call, reader

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        # isinstance(guarded, Stream) holds, as for the stream it wraps: an instrumentation
        # wrapping the guarded method (OpenLLMetry, set up after guard.instrument()) then
        # recognises the stream, reads its events and reports the call's usage and id, so
        # its span is matched to this call instead of counted as another, empty one.
        # ``__class__``, not ``type()``: the stream may itself be another instrumentation's
        # proxy (OpenInference wraps the client's request method, below this one).
        return self._stream.__class__

    def __getattr__(self, name: str) -> Any:
        if name in _OWN:  # not set yet (a failed __init__): never recurse
            raise AttributeError(name)
        return getattr(self._stream, name)

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


class GuardedStream(_Guarded):
    """A sync ``Stream`` that records its call at the end and stops on a cancel."""

    def __init__(self, stream: Any, call: ModelCall, reader: Reader) -> None:
        super().__init__(stream, call, reader)
        self._it = iter(stream)

    def __iter__(self) -> GuardedStream:
        return self

    def _stop(self, cause: BaseException | None = None) -> None:
        """A cancel reached the stream: close the HTTP response, record, raise RunStopped."""
        try:
            self._stream.close()
        except Exception:
            note_error("closing a model stream")
        self._raise_stop(cause)

    def __next__(self) -> Any:
        run = self._call.run
        while True:
            if run.interrupted:
                self._stop()
            try:
                item = next(self._it)
            except StopIteration:
                if run.interrupted:
                    self._stop()
                self._record()
                raise
            except RunStopped:
                raise
            except Exception as exc:
                if run.interrupted:
                    self._stop(exc)
                self._call.fail(exc)
                raise
            if self._reader.see(item):
                return item

    def close(self) -> None:
        self._stream.close()
        self._record()

    def __enter__(self) -> GuardedStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class GuardedAsyncStream(_Guarded):
    """An ``AsyncStream`` that records its call at the end and stops on a cancel (the run's
    task is cancelled by the SDK; the response is closed on the way out)."""

    def __init__(self, stream: Any, call: ModelCall, reader: Reader) -> None:
        super().__init__(stream, call, reader)
        self._it = stream.__aiter__()

    def __aiter__(self) -> GuardedAsyncStream:
        return self

    async def _stop(self, cause: BaseException | None = None) -> None:
        try:  # recorded first: the run's task is being cancelled, and that lands at the close
            self._record()
        finally:
            try:
                await self._stream.close()
            except Exception:
                note_error("closing a model stream")
        self._raise_stop(cause)

    async def __anext__(self) -> Any:
        run = self._call.run
        while True:
            if run.interrupted:
                await self._stop()
            try:
                item = await self._it.__anext__()
            except StopAsyncIteration:
                if run.interrupted:
                    await self._stop()
                self._record()
                raise
            except RunStopped:
                raise
            except BaseException as exc:
                if run.interrupted:
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

    async def __aenter__(self) -> GuardedAsyncStream:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
