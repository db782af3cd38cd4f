"""LangChain and LangGraph: chat models, tools, and graph runs (``guard.instrument("langchain")``, alias ``"langgraph"``).

``enable()`` wraps, on the library's base classes (so every model, tool and graph is covered,
including those made before ``guard.instrument()``):

* **Graph runs** (:mod:`guard.integrations._langgraph_runs`): ``Pregel.stream`` / ``astream``,
  which ``invoke`` / ``ainvoke`` of every compiled graph (``StateGraph.compile()``,
  ``create_react_agent``) go through. Inside a ``@guard.run`` the graph attaches to it; outside
  one each graph run is its own run, named after the graph (``graph.name``).
* **Chat model calls**: ``BaseChatModel._generate_with_cache`` / ``_agenerate_with_cache``
  (``invoke``, ``batch``, and the graph's implicit streaming) and ``stream`` / ``astream``.
  A model that talks through the ``openai`` client (``langchain_openai``'s ``BaseChatOpenAI``:
  ``ChatOpenAI``, ``AzureChatOpenAI`` and their subclasses) is counted, reserved and
  cancel-checked by the ``openai`` integration when it is on; otherwise (only this integration
  on, or another provider's model) it is guarded here, with the usage LangChain reports
  (``usage_metadata``) and the response id: one model call is counted once either way.
* **Tools**: ``BaseTool.run`` / ``arun`` (``@tool``, ``StructuredTool``, ``ToolNode``): each
  call is admitted first (:func:`~guard.integrations._base.admit_tool`) and its fingerprint and
  result hash recorded in-process, so loop detection sees it; LangGraph-injected arguments
  (state, store, runtime) are left out of the fingerprint.

A stop leaves a LangChain component as :class:`GraphRunStopped` (a ``guard.RunStopped`` that
is also LangGraph's ``GraphBubbleUp``): ``ToolNode`` never turns it into a ``ToolMessage``
(whatever ``handle_tool_errors`` says), retry policies and node error handlers do not retry or
route it, and it comes out of ``graph.invoke`` / ``ainvoke`` / ``stream`` / ``astream``. No
callback handler is used: LangChain logs and swallows a handler's exceptions unless
``raise_error`` is set, and even then logs each as an error.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable
from typing import Any

from guard.errors import RunStopped
from guard.integrations import _langgraph_runs as runs
from guard.integrations._base import (
    ModelCall,
    ToolCall,
    Usage,
    abegin_model_call,
    active_run,
    admit_tool,
    begin_model_call,
    note_error,
)

__all__ = ["LIBRARY", "NAME", "GraphRunStopped", "disable", "enable"]

NAME = "langchain"
LIBRARY = "langchain_core"

_patched: list[tuple[type, str, Any]] = []  # (class, attribute, original)


class GraphRunStopped(RunStopped):
    """``guard.RunStopped`` raised through LangChain/LangGraph. While the integration is on it
    is also a ``langgraph.errors.GraphBubbleUp`` (when LangGraph is installed), so the graph
    lets it out instead of turning it into a tool result or retrying it."""


def enable() -> None:
    """Wrap the base classes (idempotent)."""
    if _patched:
        return
    global GraphRunStopped
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.tools import BaseTool

    try:
        from langgraph.errors import GraphBubbleUp
        from langgraph.pregel import Pregel
    except ImportError:  # LangChain alone: chat models and tools only
        Pregel = None
    else:
        if not issubclass(GraphRunStopped, GraphBubbleUp):
            GraphRunStopped = type(  # the public name stays; isinstance(RunStopped) holds
                "GraphRunStopped", (GraphRunStopped, GraphBubbleUp), {"__module__": __name__}
            )
    table: list[tuple[type, str, Callable[[Any], Any]]] = [
        (BaseChatModel, "_generate_with_cache", _wrap_generate),
        (BaseChatModel, "_agenerate_with_cache", _wrap_agenerate),
        (BaseChatModel, "stream", _wrap_stream),
        (BaseChatModel, "astream", _wrap_astream),
        (BaseTool, "run", _wrap_tool),
        (BaseTool, "arun", _wrap_atool),
    ]
    if Pregel is not None:
        table += [
            (Pregel, "stream", functools.partial(runs.wrap_graph_stream, bubble=bubble)),
            (Pregel, "astream", functools.partial(runs.wrap_graph_astream, bubble=bubble)),
        ]
    for cls, attr, wrap in table:
        orig = cls.__dict__[attr]
        wrapped = wrap(orig)
        wrapped.__guard_original__ = orig
        setattr(cls, attr, wrapped)
        _patched.append((cls, attr, orig))


def disable() -> None:
    """Restore the original methods."""
    while _patched:
        cls, attr, orig = _patched.pop()
        setattr(cls, attr, orig)


def bubble(stop: RunStopped) -> RunStopped:
    """``stop`` as a :class:`GraphRunStopped` (the same outcome and message), to raise."""
    if isinstance(stop, GraphRunStopped):
        return stop
    out = GraphRunStopped(stop.outcome, str(stop))
    out.__cause__ = stop.__cause__
    return out


# -- chat models -------------------------------------------------------------------------------
def _openai_counts(model: Any) -> bool:
    """The ``openai`` integration guards this model's calls (it is on and the model calls the
    ``openai`` client): this layer then only lets its stop out."""
    if "langchain_openai" not in sys.modules:
        return False
    from guard.integrations import enabled

    if "openai" not in enabled():
        return False
    from langchain_openai.chat_models.base import BaseChatOpenAI

    return isinstance(model, BaseChatOpenAI) and all(
        _wraps_guarded(getattr(model, c, None)) for c in ("client", "async_client")
    )


def _wraps_guarded(resource: Any) -> bool:
    """A ``Completions`` resource whose ``with_raw_response`` (what langchain-openai calls) was
    built before ``guard.instrument()`` keeps the unwrapped ``create``: such a model is
    counted here, not missed by both layers."""
    raw = getattr(resource, "__dict__", {}).get("with_raw_response")  # a cached_property
    if raw is None:
        return True  # built at first use, from the wrapped create
    fn = getattr(getattr(raw, "create", None), "__wrapped__", None)
    return hasattr(getattr(fn, "__func__", fn), "__guard_original__")


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


def _begin(model: Any, stop: Any, kwargs: dict[str, Any]) -> tuple[Any, str, int | None]:
    run = active_run()
    if run is None or _openai_counts(model):
        return None, "", None
    return run, *_request(model, stop, kwargs)


def _wrap_generate(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def generate(self: Any, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any):
        try:
            run, model, max_tokens = _begin(self, stop, kw)
            call = (
                begin_model_call(run, model=model, max_tokens=max_tokens)
                if run is not None
                else None
            )
            try:
                result = orig(self, messages, stop, run_manager, **kw)
            except BaseException as exc:
                if call is not None:
                    call.fail(exc)
                raise
            if call is not None:
                _finish_result(call, result)
            return result
        except RunStopped as stop_exc:
            raise bubble(stop_exc) from stop_exc.__cause__

    return generate


def _wrap_agenerate(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    async def agenerate(
        self: Any, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any
    ):
        try:
            run, model, max_tokens = _begin(self, stop, kw)
            call = (
                await abegin_model_call(run, model=model, max_tokens=max_tokens)
                if run is not None
                else None
            )
            try:
                result = await orig(self, messages, stop, run_manager, **kw)
            except BaseException as exc:
                if call is not None:
                    call.fail(exc)
                raise
            if call is not None:
                _finish_result(call, result)
            return result
        except RunStopped as stop_exc:
            raise bubble(stop_exc) from stop_exc.__cause__

    return agenerate


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
        meta = getattr(chunk, "usage_metadata", None)
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


def _wrap_stream(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def stream(self: Any, input: Any, config: Any = None, *, stop: Any = None, **kw: Any):
        try:
            run, model, max_tokens = _begin(self, stop, kw)
            if run is not None and not _streams(self, False, kw):
                run = None
            call = (
                begin_model_call(run, model=model, max_tokens=max_tokens)
                if run is not None
                else None
            )
            seen = _StreamUsage(call)
            try:
                for chunk in orig(self, input, config, stop=stop, **kw):
                    seen.see(chunk)
                    yield chunk
            except BaseException as exc:
                seen.failed(exc)
                raise
            seen.finish()
        except RunStopped as stop_exc:
            raise bubble(stop_exc) from stop_exc.__cause__

    return stream


def _wrap_astream(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    async def astream(self: Any, input: Any, config: Any = None, *, stop: Any = None, **kw: Any):
        try:
            run, model, max_tokens = _begin(self, stop, kw)
            if run is not None and not _streams(self, True, kw):
                run = None
            call = (
                await abegin_model_call(run, model=model, max_tokens=max_tokens)
                if run is not None
                else None
            )
            seen = _StreamUsage(call)
            try:
                async for chunk in orig(self, input, config, stop=stop, **kw):
                    seen.see(chunk)
                    yield chunk
            except BaseException as exc:
                seen.failed(exc)
                raise
            seen.finish()
        except RunStopped as stop_exc:
            raise bubble(stop_exc) from stop_exc.__cause__

    return astream


# -- tools -------------------------------------------------------------------------------------
def _model_args(tool: Any, tool_input: Any) -> Any:
    """The arguments the model gave: LangGraph's injected ones (state, store, runtime, the call
    id) change every call and are no part of the action."""
    if not isinstance(tool_input, dict):
        return tool_input
    try:
        schema = tool.tool_call_schema
        if isinstance(schema, dict):
            keys = schema.get("properties")
        else:
            keys = getattr(schema, "model_fields", None)
        if not keys:
            return tool_input
        return {k: v for k, v in tool_input.items() if k in keys}
    except Exception:
        note_error("reading a LangChain tool's schema")
        return tool_input


def _tool_result(result: Any) -> Any:
    content = getattr(result, "content", None)  # a ToolMessage (called with a tool call id)
    return result if content is None else content


def _admit(tool: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> tuple[ToolCall | None, Any]:
    """Admit the call (``RunStopped``: refused); ``None`` when the guard side failed (e.g. an
    argument that cannot be fingerprinted): the tool then runs unguarded (counted)."""
    tool_input = args[0] if args else kw.get("tool_input")
    try:
        return admit_tool(str(tool.name), _model_args(tool, tool_input)), kw.get("tool_call_id")
    except RunStopped:
        raise
    except Exception:
        note_error("admitting a tool call")
        return None, None


def _wrap_tool(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def run_tool(self: Any, *args: Any, **kw: Any) -> Any:
        if active_run() is None:
            return orig(self, *args, **kw)
        try:
            call, call_id = _admit(self, args, kw)  # RunStopped: the tool does not run
            try:
                result = orig(self, *args, **kw)
            except RunStopped:
                raise
            except BaseException as exc:
                if call is not None:
                    call.failed(exc, call_id=call_id)
                raise
            if call is not None:
                call.done(_tool_result(result), call_id=call_id)
            return result
        except RunStopped as stop:
            raise bubble(stop) from stop.__cause__

    return run_tool


def _wrap_atool(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    async def arun_tool(self: Any, *args: Any, **kw: Any) -> Any:
        if active_run() is None:
            return await orig(self, *args, **kw)
        try:
            call, call_id = _admit(self, args, kw)
            try:
                result = await orig(self, *args, **kw)
            except RunStopped:
                raise
            except BaseException as exc:
                if call is not None:
                    call.failed(exc, call_id=call_id)
                raise
            if call is not None:
                call.done(_tool_result(result), call_id=call_id)
            return result
        except RunStopped as stop:
            raise bubble(stop) from stop.__cause__

    return arun_tool
