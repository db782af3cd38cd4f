"""The Anthropic Messages side of the scripted test server (``POST /v1/messages``).

Renders a scripted :class:`~_llm_server.Reply` as Anthropic's JSON body or as its server-sent
events (``message_start``, ``content_block_start`` / ``_delta`` / ``_stop``, ``message_delta``
with the final usage, ``message_stop``; each frame carries its ``event:`` line, which the
``anthropic`` client dispatches on). Usage is Anthropic's split: ``input_tokens`` excludes the
cache reads and writes, so the reply's ``input`` (the whole prompt) is
``input_tokens + cache_read_input_tokens + cache_creation_input_tokens``; thinking tokens are
``output_tokens_details.thinking_tokens``, inside ``output_tokens``.
"""

from __future__ import annotations

import json
from typing import Any

from _llm_server import Reply, Usage, _pieces

__all__ = ["error_json", "frame", "message_events", "message_json"]


def _usage(u: Usage) -> dict[str, Any]:
    return {
        "input_tokens": u.input - u.cached - u.cache_write,
        "cache_read_input_tokens": u.cached,
        "cache_creation_input_tokens": u.cache_write,
        "output_tokens": u.output,
        "output_tokens_details": {"thinking_tokens": u.reasoning},
    }


def _blocks(reply: Reply) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if reply.content is not None:
        out.append({"type": "text", "text": reply.content})
    for name, args, cid in reply.tool_calls:
        out.append({"type": "tool_use", "id": f"toolu_{cid}", "name": name, "input": args})
    return out


def _stop(reply: Reply) -> str:
    return "tool_use" if reply.tool_calls else "end_turn"


def message_json(reply: Reply, model: str, rid: str) -> dict[str, Any]:
    """The non-streaming body of one reply."""
    return {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _blocks(reply),
        "stop_reason": _stop(reply),
        "stop_sequence": None,
        "usage": _usage(reply.usage),
    }


def message_events(
    reply: Reply, model: str, rid: str, full_delta: bool = False
) -> list[dict[str, Any]]:
    """The stream of one reply: the first usage in ``message_start`` (one output token so
    far), the final output count in ``message_delta`` (its input fields absent, as Anthropic
    sends them for a plain request: a reader must keep the ones it saw first; ``full_delta``:
    the cumulative input counts too, as it sends them for others)."""
    start = {**message_json(reply, model, rid), "content": [], "stop_reason": None}
    start["usage"] = {**_usage(reply.usage), "output_tokens": 1}
    out: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for i, block in enumerate(_blocks(reply)):
        if block["type"] == "text":
            head, deltas = (
                {"type": "text", "text": ""},
                [{"type": "text_delta", "text": p} for p in _pieces(block["text"])],
            )
        else:
            head = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
        out.append({"type": "content_block_start", "index": i, "content_block": head})
        out.append({"type": "ping"})
        out += [{"type": "content_block_delta", "index": i, "delta": d} for d in deltas]
        out.append({"type": "content_block_stop", "index": i})
    final: dict[str, Any] = {"output_tokens": reply.usage.output}
    if full_delta:
        final = {**_usage(reply.usage), **final}
    final["output_tokens_details"] = {"thinking_tokens": reply.usage.reasoning}
    delta = {"stop_reason": _stop(reply), "stop_sequence": None}
    out.append({"type": "message_delta", "delta": delta, "usage": final})
    out.append({"type": "message_stop"})
    return out


def frame(event: dict[str, Any]) -> bytes:
    """One server-sent event, with the ``event:`` line Anthropic's client dispatches on."""
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


def error_json(message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": "api_error", "message": message}}
