"""LangChain chat model calls, guarded (part of :mod:`guard.integrations.langgraph`).

``BaseChatModel._generate_with_cache`` / ``_agenerate_with_cache`` (``invoke``, ``batch``, and a
graph's implicit streaming) and ``stream`` / ``astream`` are wrapped. A model that talks
through a client another integration guards is counted, reserved and cancel-checked there, and
this layer only lets its stop out (:func:`counted_by_client`): ``langchain_openai``'s
``BaseChatOpenAI`` (``ChatOpenAI``, ``AzureChatOpenAI``) over the ``openai`` client, and
``langchain_anthropic``'s ``ChatAnthropic`` over the ``anthropic`` client (its
``messages`` and, with betas, ``beta.messages``). Any other model, or these with their client
integration off, is guarded here, with the usage LangChain reports (``usage_metadata``) and the
response id: one model call is counted once either way.

Each wrapper takes ``bubble``, which turns a stop into the ``RunStopped`` LangGraph lets out.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

from guard.errors import RunStopped
from guard.integrations._base import ModelCall, Prompt, Usage, active_run, begin_call, note_error
from guard.integrations._twins import Body, Wait, adrive, async_generator, drive

__all__ = [
    "Bubble",
    "Bubbling",
    "Wrapped",
    "counted_by_client",
    "wrap_agenerate",
    "wrap_astream",
    "wrap_generate",
    "wrap_stream",
]

Bubble = Callable[[RunStopped], RunStopped]  # a stop, as the RunStopped LangGraph lets out
Kw = dict[str, Any]


class Wrapped(NamedTuple):
    """What a wrapper was made of, handed to its body (:mod:`._twins`): one tuple per
    wrapped method."""

    orig: Callable[..., Any]
    bubble: Bubble
    is_async: bool


class Bubbling:
    """Around a call made outside a run (nothing to guard, so no body is made): a stop that
    comes out of it still comes out as the ``RunStopped`` LangGraph lets out. One per
    wrapper, reused by every call."""

    __slots__ = ("bubble",)

    def __init__(self, bubble: Bubble) -> None:
        self.bubble = bubble

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: Any, exc: BaseException | None, tb: Any) -> None:
        if isinstance(exc, RunStopped):
            raise self.bubble(exc) from exc.__cause__


# -- who counts a model's calls ------------------------------------------------------------------
def counted_by_client(model: Any) -> bool:
    """A client integration that is on counts this model's calls (the model calls its client,
    and every client resource the model has built so far is the guarded one)."""
    resources = _client_resources(model)
    return resources is not None and all(_wraps_guarded(r) for r in resources)


def _client_resources(model: Any) -> list[Any] | None:
    """The client resources a model of a guarded client calls (``None``: no client integration
    counts this model)."""
    from guard.integrations import enabled

    on = enabled()
    if "openai" in on and "langchain_openai" in sys.modules:
        from langchain_openai.chat_models.base import BaseChatOpenAI

        if isinstance(model, BaseChatOpenAI):
            return [getattr(model, c, None) for c in ("client", "async_client")]
    if "anthropic" in on and "langchain_anthropic" in sys.modules:
        from langchain_anthropic import ChatAnthropic

        if isinstance(model, ChatAnthropic):
            # its clients are cached properties, built at first use (from the wrapped classes)
            paths = (("messages",), ("beta", "messages"))
            return [_built(model, c, *p) for c in ("_client", "_async_client") for p in paths]
    return None


def _built(obj: Any, *path: str) -> Any:
    """The cached attribute at ``path`` if every step of it was built already, else ``None``."""
    for name in path:
        obj = vars(obj).get(name) if hasattr(obj, "__dict__") else None
        if obj is None:
            return None
    return obj


def _wraps_guarded(resource: Any) -> bool:
    """A resource whose ``with_raw_response`` (what the LangChain models call) was built
    before ``guard.instrument()`` keeps the unwrapped ``create``: such a model is counted here,
    not missed by both layers."""
    raw = getattr(resource, "__dict__", {}).get("with_raw_response")  # a cached_property
    if raw is None:
        return True  # built at first use, from the wrapped create
    fn = getattr(getattr(raw, "create", None), "__wrapped__", None)
    return hasattr(getattr(fn, "__func__", fn), "__guard_original__")


# -- reading requests and results ----------------------------------------------------------------
def _request(model: Any, stop: Any, kwargs: dict[str, Any]) -> tuple[str, int | None]:
    """The model name and the max tokens of a request, as LangChain reports them to tracers."""
    try:
        ls = model._get_ls_params(stop=stop, **kwargs)
    except Exception:
        note_error("reading a LangChain model's parameters")
        ls = {}
    name = ls.get("ls_model_name") or getattr(model, "model_name", None) or "unknown"
    max_tokens = ls.get("ls_max_tokens")
    return str(name), max_tokens if type(max_tokens) is int and max_tokens > 0 else None


def _prompt(messages: Any, kwargs: dict[str, Any]) -> Prompt:
    """What the call sends: its messages (a list, or a ``stream`` input: a string, a
    ``PromptValue``, message tuples) and the tools ``bind_tools`` passed."""
    return Prompt(messages, tools=kwargs.get("tools"))


def _int(d: Any, key: str) -> int:
    v = d.get(key) if isinstance(d, dict) else None
    return v if type(v) is int and v >= 0 else 0


def _usage(meta: Any) -> Usage | None:
    """LangChain's ``UsageMetadata`` (input includes cache reads, output includes reasoning)."""
    if not isinstance(meta, dict):
        return None
    return Usage(
        input_tokens=_int(meta, "input_tokens"),
        output_tokens=_int(meta, "output_tokens"),
        cached_tokens=_int(meta.get("input_token_details"), "cache_read"),
        reasoning_tokens=_int(meta.get("output_token_details"), "reasoning"),
    )


def _response_id(message: Any, llm_output: Any = None) -> str | None:
    meta = getattr(message, "response_metadata", None)
    for src in (meta, llm_output):
        rid = src.get("id") if isinstance(src, dict) else None
        if isinstance(rid, str) and rid:
            return rid
    return None


def _finish_result(call: ModelCall, result: Any) -> None:
    gens = getattr(result, "generations", None) or []
    msg = getattr(gens[0], "message", None) if gens else None
    call.finish(
        _usage(getattr(msg, "usage_metadata", None)),
        _response_id(msg, getattr(result, "llm_output", None)),
    )


def _attached(call: ModelCall | None) -> contextlib.AbstractContextManager[None]:
    # The call's step is current and its span marked counted while the provider's client runs:
    # a span that client emits itself (the anthropic client's own) is this call, not another.
    return call.attached() if call is not None else contextlib.nullcontext()


_END = object()


def _begin(model: Any, stop: Any, kwargs: dict[str, Any]) -> tuple[Any, str, int | None]:
    run = active_run()
    if run is None or counted_by_client(model):
        return None, "", None
    return run, *_request(model, stop, kwargs)


def wrap_generate(orig: Callable[..., Any], *, bubble: Bubble) -> Callable[..., Any]:
    w, outside = Wrapped(orig, bubble, False), Bubbling(bubble)

    @functools.wraps(orig)
    def generate(self: Any, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any):
        if active_run() is None:
            with outside:
                return orig(self, messages, stop, run_manager, **kw)
        return drive(_generate(w, self, messages, stop, run_manager, kw))

    return generate


def wrap_agenerate(orig: Callable[..., Any], *, bubble: Bubble) -> Callable[..., Any]:
    w, outside = Wrapped(orig, bubble, True), Bubbling(bubble)

    @functools.wraps(orig)
    async def agenerate(
        self: Any, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any
    ):
        if active_run() is None:
            with outside:
                return await orig(self, messages, stop, run_manager, **kw)
        return await adrive(_generate(w, self, messages, stop, run_manager, kw))

    return agenerate


def _generate(w: Wrapped, model: Any, messages: Any, stop: Any, manager: Any, kw: Kw) -> Body[Any]:
    """One ``_generate_with_cache`` call, both forms (:mod:`._twins`)."""
    try:
        run, name, max_tokens = _begin(model, stop, kw)
        call = None
        if run is not None:
            prompt = _prompt(messages, kw)
            call = yield from begin_call(run, w.is_async, name, max_tokens, prompt=prompt)
        try:
            with _attached(call):
                result = w.orig(model, messages, stop, manager, **kw)
                if w.is_async:
                    result = yield result
        except BaseException as exc:
            if call is not None:
                call.fail(exc)
            raise
        if call is not None:
            _finish_result(call, result)
        return result
    except RunStopped as stop_exc:
        raise w.bubble(stop_exc) from stop_exc.__cause__


class _StreamUsage:
    """A streamed model call: usage and response id added up from its chunks, recorded once."""

    __slots__ = ("call", "meta", "response_id")

    def __init__(self, call: ModelCall | None) -> None:
        self.call = call
        self.meta: Any = None
        self.response_id: str | None = None

    def finish(self) -> None:
        if self.call is not None:
            self.call.finish(_usage(self.meta), self.response_id)

    def failed(self, exc: BaseException) -> None:
        if self.call is None:
            return
        if isinstance(exc, GeneratorExit):  # the caller stopped reading: what was spent counts
            with contextlib.suppress(RunStopped):  # raised at the run's next call instead
                self.finish()
        elif isinstance(exc, Exception):
            self.call.fail(exc)
        else:
            self.call.abandon()

    def see(self, chunk: Any) -> None:
        meta: Any = getattr(chunk, "usage_metadata", None)
        if isinstance(meta, dict):
            if self.meta is None:
                self.meta = meta
            else:
                from langchain_core.messages.ai import add_usage

                self.meta = add_usage(self.meta, meta)
        if self.response_id is None:
            self.response_id = _response_id(chunk)


def _streams(model: Any, is_async: bool, kw: dict[str, Any]) -> bool:
    # Mirrors BaseChatModel.stream: a model that does not stream is invoked (counted there).
    try:
        return bool(model._should_stream(async_api=is_async, **{**kw, "stream": True}))
    except Exception:
        return False


def wrap_stream(orig: Callable[..., Any], *, bubble: Bubble) -> Callable[..., Any]:
    w, outside = Wrapped(orig, bubble, False), Bubbling(bubble)

    @functools.wraps(orig)
    def stream(self: Any, input: Any, config: Any = None, *, stop: Any = None, **kw: Any):
        if active_run() is None:
            with outside:
                yield from orig(self, input, config, stop=stop, **kw)
            return
        yield from _stream(w, self, input, config, stop, kw)

    return stream


def wrap_astream(orig: Callable[..., Any], *, bubble: Bubble) -> Callable[..., Any]:
    w = Wrapped(orig, bubble, True)

    def body(self: Any, input: Any, config: Any = None, *, stop: Any = None, **kw: Any) -> Any:
        if active_run() is None:  # the model's own stream, passed on as it is
            return orig(self, input, config, stop=stop, **kw)
        return _stream(w, self, input, config, stop, kw)

    return functools.wraps(orig)(async_generator(body, Bubbling(bubble)))


def _stream(w: Wrapped, model: Any, input: Any, config: Any, stop: Any, kw: Kw) -> Body[None]:
    """One ``stream`` / ``astream`` call, both forms (:mod:`._twins`): the chunks, and in the
    async form what it awaits, as a ``Wait``."""
    is_async = w.is_async
    try:
        run, name, max_tokens = _begin(model, stop, kw)
        if run is not None and not _streams(model, is_async, kw):
            run = None
        call = None
        if run is not None:
            begun = begin_call(run, is_async, name, max_tokens, prompt=_prompt(input, kw))
            call = drive(begun) if not is_async else (yield Wait(adrive(begun)))
        seen = _StreamUsage(call)
        try:
            it = w.orig(model, input, config, stop=stop, **kw)
            while True:
                with _attached(call):  # around each read, never across a yield
                    chunk = next(it, _END) if not is_async else (yield Wait(anext(it, _END)))
                if chunk is _END:
                    break
                seen.see(chunk)
                yield chunk
        except BaseException as exc:
            seen.failed(exc)
            raise
        seen.finish()
    except RunStopped as stop_exc:
        raise w.bubble(stop_exc) from stop_exc.__cause__
