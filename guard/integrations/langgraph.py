"""LangChain and LangGraph: chat models, tools, and graph runs (``guard.instrument("langchain")``, alias ``"langgraph"``).

``enable()`` wraps, on the library's base classes (so every model, tool and graph is covered,
including those made before ``guard.instrument()``):

* **Graph runs** (:mod:`guard.integrations._langgraph_runs`): ``Pregel.stream`` / ``astream``,
  which ``invoke`` / ``ainvoke`` of every compiled graph (``StateGraph.compile()``,
  ``create_react_agent``) go through. Inside a ``@guard.run`` the graph attaches to it; outside
  one each graph run is its own run, named after the graph (``graph.name``).
* **Chat model calls** (:mod:`guard.integrations._langchain_models`):
  ``BaseChatModel._generate_with_cache`` / ``_agenerate_with_cache`` (``invoke``, ``batch``,
  and the graph's implicit streaming) and ``stream`` / ``astream``. A model that talks through
  a guarded client (``langchain_openai``'s ``ChatOpenAI`` and its kin over the ``openai``
  client, ``langchain_anthropic``'s ``ChatAnthropic`` over the ``anthropic`` client) is
  counted, reserved and cancel-checked by that client's integration when it is on; otherwise
  (only this integration on, or another provider's model) it is guarded here, with the usage
  LangChain reports (``usage_metadata``) and the response id: one model call is counted once
  either way.
* **Tools** (:mod:`guard.integrations._langchain_tools`): ``BaseTool.run`` / ``arun``
  (``@tool``, ``StructuredTool``, ``ToolNode``): each call is admitted first and its
  fingerprint and result hash recorded in-process, so loop detection sees it.

A stop leaves a LangChain component as :class:`GraphRunStopped` (a ``guard.RunStopped`` that
is also LangGraph's ``GraphBubbleUp``): ``ToolNode`` never turns it into a ``ToolMessage``
(whatever ``handle_tool_errors`` says), retry policies and node error handlers do not retry or
route it, and it comes out of ``graph.invoke`` / ``ainvoke`` / ``stream`` / ``astream``. No
callback handler is used: LangChain logs and swallows a handler's exceptions unless
``raise_error`` is set, and even then logs each as an error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from guard.errors import RunStopped
from guard.integrations import _langchain_models as models
from guard.integrations import _langchain_tools as tools
from guard.integrations import _langgraph_runs as runs

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
        Pregel = None  # no graph class to wrap then
    else:
        if not issubclass(GraphRunStopped, GraphBubbleUp):
            GraphRunStopped = type(  # type: ignore[misc, assignment]  # the public name stays; isinstance(RunStopped) holds
                "GraphRunStopped", (GraphRunStopped, GraphBubbleUp), {"__module__": __name__}
            )
    table: list[tuple[type, str, Callable[..., Any]]] = [
        (BaseChatModel, "_generate_with_cache", models.wrap_generate),
        (BaseChatModel, "_agenerate_with_cache", models.wrap_agenerate),
        (BaseChatModel, "stream", models.wrap_stream),
        (BaseChatModel, "astream", models.wrap_astream),
        (BaseTool, "run", tools.wrap_tool),
        (BaseTool, "arun", tools.wrap_atool),
    ]
    if Pregel is not None:
        table += [
            (Pregel, "stream", runs.wrap_graph_stream),
            (Pregel, "astream", runs.wrap_graph_astream),
        ]
    for cls, attr, wrap in table:
        orig = cls.__dict__[attr]
        wrapped = wrap(orig, bubble=bubble)
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
