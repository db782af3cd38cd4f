"""Tool calls a hand-written loop ran, read back from the conversation it sends next.

A loop on the plain ``openai`` client runs the tools itself, so no integration sees them run.
It does send each result back to the model: a chat request carries the assistant message
with its ``tool_calls`` and a ``role: "tool"`` message per result, a responses request
carries ``function_call`` / ``function_call_output`` items, and an Anthropic Messages request
carries ``tool_use`` content blocks in the assistant turns and ``tool_result`` blocks (by
``tool_use_id``) in the user turns that answer them. :func:`note_tools`, called before
each guarded model call, records every tool call whose result a request carries for the first
time (fingerprinted in-process through :func:`~guard.integrations._base.admit_tool`, so loop
detection sees it and no raw argument leaves), so ``guard.instrument()`` plus ``@guard.run``
is the whole setup. A loop found that way stops the run before the request leaves.

Counted once: tools the code records itself (``@guard.tool``, ``step.tool_call``) raise the
run's own tool count between two model calls, and that many results are taken as already
counted. Not read: a responses request that names its calls only through
``previous_response_id`` (the call is then on the server, not in the request).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

from guard.errors import RunStopped
from guard.integrations._base import admit_tool, note_error
from guard.integrations._client import field as _get

__all__ = ["note_tools"]

_MAX_SEEN = 4096  # call ids remembered per run (a long run forgets its oldest)


class _State:
    __slots__ = ("native", "seen")

    def __init__(self, native: int) -> None:
        self.seen: dict[str, None] = {}  # insertion-ordered: the oldest are pruned first
        self.native = native


_states: weakref.WeakKeyDictionary[Any, _State] = weakref.WeakKeyDictionary()


def _results(api: str, kw: dict[str, Any]) -> Iterator[tuple[str, Any, Any, Any]]:
    """(call id, tool name, arguments, result) of each tool result the request carries."""
    asked: dict[Any, tuple[Any, Any]] = {}
    if api == "anthropic":
        for m in kw.get("messages") or ():
            blocks = _get(m, "content")
            if isinstance(blocks, str) or not isinstance(blocks, list | tuple):
                continue  # plain text (or a block iterator, left unread for the caller)
            for b in blocks:
                kind = _get(b, "type")
                if kind == "tool_use":  # dicts, or the client's ToolUseBlock sent back as is
                    asked[_get(b, "id")] = (_get(b, "name"), _get(b, "input"))
                elif kind == "tool_result" and _get(b, "tool_use_id") in asked:
                    cid = _get(b, "tool_use_id")
                    yield cid, *asked[cid], _get(b, "content")
        return
    if api == "chat":
        for m in kw.get("messages") or ():
            role = _get(m, "role")
            if role == "assistant":
                for c in _get(m, "tool_calls") or ():
                    f = _get(c, "function")
                    asked[_get(c, "id")] = (_get(f, "name"), _get(f, "arguments"))
            elif role == "tool" and _get(m, "tool_call_id") in asked:
                cid = _get(m, "tool_call_id")
                yield cid, *asked[cid], _get(m, "content")
        return
    items = kw.get("input")
    if not isinstance(items, list | tuple):
        return
    for it in items:
        kind = _get(it, "type")
        if kind == "function_call":
            asked[_get(it, "call_id")] = (_get(it, "name"), _get(it, "arguments"))
        elif kind == "function_call_output" and _get(it, "call_id") in asked:
            cid = _get(it, "call_id")
            yield cid, *asked[cid], _get(it, "output")


def _tool_count(run: Any) -> int:
    return run.budget.usage().tool_calls


def note_tools(run: Any, api: str, kw: dict[str, Any]) -> None:
    """Before a model call of ``run``: record the tool calls whose results ``kw`` (the
    request's arguments) carries for the first time. Raises ``RunStopped`` only for a real
    stop (a loop those calls complete, a tool quota); anything else is logged and counted."""
    try:
        st = _states.get(run)
        if st is None:
            st = _states[run] = _State(_tool_count(run))
        fresh = [r for r in _results(api, kw) if isinstance(r[0], str) and r[0] not in st.seen]
        own = _tool_count(run) - st.native  # recorded by the code itself since the last call
        try:
            for cid, name, args, result in fresh:
                st.seen[cid] = None
                if own > 0:
                    own -= 1
                    continue
                call = admit_tool(name if isinstance(name, str) and name else "tool", args, run)
                if call is not None:
                    call.done(result, call_id=cid)
        finally:
            st.native = _tool_count(run)
            while len(st.seen) > _MAX_SEEN:
                del st.seen[next(iter(st.seen))]
    except RunStopped:
        raise
    except Exception:
        note_error("reading tool calls from a request")
