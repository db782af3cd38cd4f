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

Counted once, and only in the run that made it (the run's :class:`~guard.sdk._tool_ledger.ToolLedger`):

* a result counts only when a model response of this run asked for its call
  (:func:`note_asked`, read from each response as it is recorded). A chat resends its earlier
  turns (an Agents SDK session, Pydantic AI's ``message_history``, a LangGraph checkpointer, a
  hand-kept ``messages`` list), and a resumed graph its calls from before the interrupt: those
  calls were made before this run began, so they are not counted or fed to loop detection
  again;
* a call recorded while it ran (a framework integration, ``@guard.tool``, ``step.tool_call``)
  is known by its call id, or, recorded without one, matched by its action fingerprint;
* a responses conversation continued by ``previous_response_id`` resends only the results:
  the calls' names and arguments come from the response that asked for them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from guard.errors import RunStopped
from guard.integrations._base import admit_tool, note_error
from guard.integrations._client import field as _get
from guard.sdk._batch import call_name_args
from guard.sdk._tool_ledger import ToolLedger

__all__ = ["note_asked", "note_response", "note_tools"]


def _results(api: str, kw: dict[str, Any]) -> Iterator[tuple[Any, Any, Any, Any]]:
    """(call id, tool name, arguments, result) of each tool result the request carries; the
    name and arguments are ``None`` when the request does not resend the call (a responses
    request continued by ``previous_response_id``)."""
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
                elif kind == "tool_result":
                    cid = _get(b, "tool_use_id")
                    yield cid, *asked.get(cid, _UNSENT), _get(b, "content")
        return
    if api == "chat":
        for m in kw.get("messages") or ():
            role = _get(m, "role")
            if role == "assistant":
                for c in _get(m, "tool_calls") or ():
                    f = _get(c, "function")
                    asked[_get(c, "id")] = (_get(f, "name"), _get(f, "arguments"))
            elif role == "tool":
                cid = _get(m, "tool_call_id")
                yield cid, *asked.get(cid, _UNSENT), _get(m, "content")
        return
    items = kw.get("input")
    if not isinstance(items, list | tuple):
        return
    for it in items:
        kind = _get(it, "type")
        if kind == "function_call":
            asked[_get(it, "call_id")] = (_get(it, "name"), _get(it, "arguments"))
        elif kind == "function_call_output":
            cid = _get(it, "call_id")
            yield cid, *asked.get(cid, _UNSENT), _get(it, "output")


_UNSENT = (None, None)


def note_tools(run: Any, api: str, kw: dict[str, Any]) -> None:
    """Before a model call of ``run``: record the tool calls whose results ``kw`` (the
    request's arguments) carries for the first time, among those the run's own responses
    asked for. Raises ``RunStopped`` only for a real stop (a loop those calls complete, a
    tool quota); anything else is logged and counted."""
    try:
        ledger: ToolLedger = run.tool_ledger
        for cid, name, args, result in list(_results(api, kw)):
            asked = ledger.claim(cid) if isinstance(cid, str) else None
            if asked is None:
                continue  # counted already, or not asked for in this run: history
            name = name if name is not None else asked[0]
            args = args if args is not None else asked[1]
            name, args = call_name_args(
                {"name": name if isinstance(name, str) and name else "tool", "arguments": args}
            )
            if ledger.take_unnamed(name, run.fp.action(name, args)):
                continue  # the code that ran it recorded it, without a call id
            call = admit_tool(name, args, run)
            if call is not None:
                call.done(result, call_id=cid)
        ledger.read_back()
    except RunStopped:
        raise
    except Exception:
        note_error("reading tool calls from a request")


def note_asked(run: Any, call_id: Any, name: Any = None, arguments: Any = None) -> None:
    """A model response of ``run`` asked for the tool call ``call_id``: its result, in a later
    request, is a call of this run."""
    if isinstance(call_id, str) and call_id:
        run.tool_ledger.ask(call_id, name, arguments)


def note_response(run: Any, api: str, response: Any) -> None:
    """A model call of ``run`` answered with ``response`` (a parsed body, or the final
    response of a responses stream): note the tool calls it asks for (:func:`note_asked`)."""
    try:
        if api == "chat":
            for choice in _get(response, "choices") or ():
                for c in _get(_get(choice, "message"), "tool_calls") or ():
                    f = _get(c, "function")
                    note_asked(run, _get(c, "id"), _get(f, "name"), _get(f, "arguments"))
        elif api == "anthropic":
            for b in _get(response, "content") or ():
                if _get(b, "type") == "tool_use":
                    note_asked(run, _get(b, "id"), _get(b, "name"), _get(b, "input"))
        else:
            for it in _get(response, "output") or ():
                if _get(it, "type") == "function_call":
                    note_asked(run, _get(it, "call_id"), _get(it, "name"), _get(it, "arguments"))
    except Exception:
        note_error("reading the tool calls of a response")
