"""LangChain tool calls, admitted and recorded (part of :mod:`guard.integrations.langgraph`).

``BaseTool.run`` / ``arun`` (``@tool``, ``StructuredTool``, ``ToolNode``) are wrapped: each call
is admitted first (:func:`~guard.integrations._base.admit_tool`; a refused one never runs) and
its fingerprint and result hash are recorded in-process, so loop detection sees it.
LangGraph-injected arguments (state, store, runtime, the call id) are left out of the
fingerprint. Each wrapper takes ``bubble``, which turns a stop into the ``RunStopped``
LangGraph lets out (``ToolNode`` never makes it a ``ToolMessage``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

from guard.errors import RunStopped
from guard.integrations._base import ToolCall, active_run, admit_tool, note_error
from guard.integrations._langchain_models import Bubble, Wrapped
from guard.integrations._twins import Body, adrive, drive

__all__ = ["wrap_atool", "wrap_tool"]

_NOTHING = contextlib.nullcontext()


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


def wrap_tool(orig: Callable[..., Any], *, bubble: Bubble) -> Callable[..., Any]:
    w = Wrapped(orig, bubble, False)

    @functools.wraps(orig)
    def run_tool(self: Any, *args: Any, **kw: Any) -> Any:
        if active_run() is None:
            return orig(self, *args, **kw)
        return drive(_run_tool(w, self, args, kw))

    return run_tool


def wrap_atool(orig: Callable[..., Any], *, bubble: Bubble) -> Callable[..., Any]:
    w = Wrapped(orig, bubble, True)

    @functools.wraps(orig)
    async def arun_tool(self: Any, *args: Any, **kw: Any) -> Any:
        if active_run() is None:
            return await orig(self, *args, **kw)
        return await adrive(_run_tool(w, self, args, kw))

    return arun_tool


def _run_tool(w: Wrapped, tool: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> Body[Any]:
    """One tool call inside a run, both forms (:mod:`._twins`)."""
    try:
        call, call_id = _admit(tool, args, kw)  # RunStopped: the tool does not run
        try:
            with call.running(call_id) if call is not None else _NOTHING:
                result = w.orig(tool, *args, **kw)
                if w.is_async:
                    result = yield result
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
        raise w.bubble(stop) from stop.__cause__
