"""A scripted OpenAI-compatible HTTP server for integration tests (no network, no key).

Real HTTP on 127.0.0.1:0 (``aiohttp.web`` in a thread with its own event loop), serving
``POST /v1/chat/completions``, ``POST /v1/responses`` and Anthropic's ``POST /v1/messages``
(``_llm_anthropic``) as JSON or, with ``stream: true``, as server-sent events, with usage
(input / output / cached / reasoning tokens; cache writes for Anthropic)::

    with LLMServer([tool("lookup", {"q": "a"}), text("done")]) as llm:
        client = openai.OpenAI(base_url=llm.base_url, api_key="test", max_retries=0)
        ...
        assert llm.count == 2

The *script* answers each request: a list of replies (served in order; the last one repeats
once the list is used up) or a function ``(request json, api) -> Reply`` where ``api`` is
``"chat"``, ``"responses"`` or ``"anthropic"`` (e.g. a tool call with new arguments every time). The server
counts requests (``count``, ``requests``) so a test can assert how many model calls happened
after a cancel, and ``hold()`` makes the next request wait until released, so a cancel can land
while a call is in flight (``gate.arrived`` is set once the request is held; for a stream,
after ``after_events`` events were sent; ``gate.disconnected`` once the client closed it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from aiohttp import web

__all__ = ["Gate", "LLMServer", "Reply", "Usage", "error", "text", "tool"]


@dataclasses.dataclass(frozen=True)
class Usage:
    """Token usage of one reply; ``input`` includes ``cached`` (and ``cache_write``, which only
    the Anthropic endpoint reports), ``output`` includes ``reasoning``."""

    input: int = 10
    output: int = 5
    cached: int = 0
    reasoning: int = 0
    cache_write: int = 0

    @property
    def total(self) -> int:
        return self.input + self.output


@dataclasses.dataclass(frozen=True)
class Reply:
    """One scripted answer: text, tool calls (``(name, arguments, call_id)``), or an error."""

    content: str | None = None
    tool_calls: tuple[tuple[str, dict[str, Any], str], ...] = ()
    usage: Usage = Usage()
    status: int = 200
    error_message: str = ""


def text(content: str = "ok", **usage: int) -> Reply:
    """A plain answer: ``text("done", input=100, output=20, cached=10, reasoning=5)``."""
    return Reply(content=content, usage=Usage(**usage))


_ids = itertools.count(1)


def tool(name: str, arguments: dict[str, Any] | None = None, **usage: int) -> Reply:
    """An answer asking for one tool call: ``tool("lookup", {"q": "x"}, input=50)``."""
    call = (name, dict(arguments or {}), f"call_{next(_ids)}")
    return Reply(tool_calls=(call,), usage=Usage(**usage))


def error(status: int = 500, message: str = "scripted failure") -> Reply:
    return Reply(status=status, error_message=message)


_ID_PREFIX = {"chat": "chatcmpl-", "responses": "resp-", "anthropic": "msg_"}

Script = Sequence[Reply] | Callable[[dict[str, Any], str], Reply]


class Gate:
    """Holds one request until :meth:`release` (thread-safe; tests wait on the events)."""

    def __init__(self, after_events: int) -> None:
        self.after_events = after_events
        self.claimed = False  # taken by a request (under the server's lock)
        self.arrived = threading.Event()
        self.released = threading.Event()
        self.disconnected = threading.Event()

    def release(self) -> None:
        self.released.set()

    @contextlib.contextmanager
    def held(self, watchdog_s: float = 10.0) -> Iterator[None]:
        """Hold the rest of the stream while the client should close it (so the server sees
        the disconnect: released early, a short stream is written to its end before the
        client closes); opens by itself after ``watchdog_s`` (a client that never closes
        would block on the next event, and its test then fails on what it read), and on the
        way out."""
        watchdog = threading.Timer(watchdog_s, self.release)
        watchdog.start()
        try:
            yield
        finally:
            watchdog.cancel()
            self.release()

    async def wait(self, request: web.BaseRequest) -> None:
        self.arrived.set()
        while not self.released.is_set():  # poll: the event is a thread one
            transport = request.transport
            if transport is None or transport.is_closing():
                self.disconnected.set()
            await asyncio.sleep(0.005)


class LLMServer:
    """The server; a context manager (``with LLMServer(script) as llm``) or start()/stop()."""

    def __init__(self, script: Script | None = None) -> None:
        self.script: Script = script if script is not None else [text()]
        self.requests: list[tuple[str, dict[str, Any]]] = []  # (api, request json)
        # Anthropic streams: message_delta repeats the cumulative input counts (as the API
        # does for some requests), instead of only the output count
        self.anthropic_full_delta = False
        self._gates: list[Gate] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        """What ``openai.OpenAI(base_url=...)`` (or ``OPENAI_BASE_URL``) takes."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """What ``anthropic.Anthropic(base_url=...)`` (or ``ANTHROPIC_BASE_URL``) takes."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LLMServer:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self._thread.start()
        if not ready.wait(10.0):
            raise RuntimeError("the LLM test server did not start")
        return self

    def stop(self) -> None:
        with self._lock:
            for g in self._gates:
                g.release()
        loop = self._loop
        if loop is not None and self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), loop).result(10.0)
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10.0)

    def __enter__(self) -> LLMServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _serve(self, ready: threading.Event) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/messages", self._messages)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        self.port = self._runner.addresses[0][1]
        ready.set()
        loop.run_forever()
        loop.close()

    # -- test controls ------------------------------------------------------------------------
    @property
    def count(self) -> int:
        """Requests received so far (every model call that left the client)."""
        with self._lock:
            return len(self.requests)

    def hold(self, after_events: int = 0) -> Gate:
        """Hold the next request until ``gate.release()``; a stream first sends
        ``after_events`` events. Returns the gate."""
        g = Gate(after_events)
        with self._lock:
            self._gates.append(g)
        return g

    def _next(self, body: dict[str, Any], api: str) -> tuple[Reply, Gate | None]:
        with self._lock:
            n = len(self.requests)
            self.requests.append((api, body))
            gate = next((g for g in self._gates if not g.claimed), None)
            if gate is not None:
                gate.claimed = True
        script = self.script
        reply = script(body, api) if callable(script) else script[min(n, len(script) - 1)]
        return reply, gate

    # -- handlers -----------------------------------------------------------------------------
    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "chat")

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "responses")

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "anthropic")

    async def _handle(self, request: web.Request, api: str) -> web.StreamResponse:
        import _llm_anthropic as anth  # the Anthropic renderers (they import this module)

        body = await request.json()
        reply, gate = self._next(body, api)
        if reply.status != 200:
            if gate is not None:
                await gate.wait(request)
            err = {"error": {"message": reply.error_message, "type": "server_error"}}
            if api == "anthropic":
                err = anth.error_json(reply.error_message)
            return web.json_response(err, status=reply.status)
        model = str(body.get("model", "gpt-4.1"))
        rid = f"{_ID_PREFIX[api]}{next(_ids)}"
        if not body.get("stream"):
            if gate is not None:
                await gate.wait(request)
            render = {"chat": _chat_json, "responses": _responses_json}.get(api, anth.message_json)
            return web.json_response(render(reply, model, rid))
        if api == "chat":
            with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            events = _chat_events(reply, model, rid, with_usage)
        elif api == "anthropic":
            events = anth.message_events(reply, model, rid, self.anthropic_full_delta)
        else:
            events = _responses_events(reply, model, rid)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for i, event in enumerate(events):
                if gate is not None and i == gate.after_events:
                    await gate.wait(request)
                if api == "anthropic":
                    await resp.write(anth.frame(event))
                else:
                    await resp.write(f"data: {json.dumps(event)}\n\n".encode())
            if api == "chat":
                await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, RuntimeError):  # the client closed the stream
            if gate is not None:
                gate.disconnected.set()
        return resp


# -- rendering: chat completions ----------------------------------------------------------------
def _chat_usage(u: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": u.input,
        "completion_tokens": u.output,
        "total_tokens": u.total,
        "prompt_tokens_details": {"cached_tokens": u.cached},
        "completion_tokens_details": {"reasoning_tokens": u.reasoning},
    }


def _chat_tool_calls(reply: Reply) -> list[dict[str, Any]]:
    return [
        {"id": cid, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for n, a, cid in reply.tool_calls
    ]


def _finish(reply: Reply) -> str:
    return "tool_calls" if reply.tool_calls else "stop"


def _chat_json(reply: Reply, model: str, rid: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = _chat_tool_calls(reply)
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": _finish(reply)}],
        "usage": _chat_usage(reply.usage),
    }


def _chat_events(reply: Reply, model: str, rid: str, with_usage: bool) -> list[dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
        }

    out = [chunk({"role": "assistant", "content": ""})]
    for piece in _pieces(reply.content or ""):
        out.append(chunk({"content": piece}))
    for i, call in enumerate(_chat_tool_calls(reply)):
        out.append(chunk({"tool_calls": [{"index": i, **call}]}))
    out.append(chunk({}, _finish(reply)))
    if with_usage:
        last = chunk({})
        last["choices"], last["usage"] = [], _chat_usage(reply.usage)
        out.append(last)
    return out


def _pieces(s: str) -> list[str]:
    return [s[i : i + 4] for i in range(0, len(s), 4)]


# -- rendering: responses -------------------------------------------------------------------------
def _responses_usage(u: Usage) -> dict[str, Any]:
    return {
        "input_tokens": u.input,
        "output_tokens": u.output,
        "total_tokens": u.total,
        "input_tokens_details": {"cached_tokens": u.cached},
        "output_tokens_details": {"reasoning_tokens": u.reasoning},
    }


def _items(reply: Reply, rid: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if reply.content is not None:
        part = {"type": "output_text", "text": reply.content, "annotations": []}
        items.append(
            {
                "type": "message",
                "id": f"msg_{rid}",
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
        )
    for name, args, cid in reply.tool_calls:
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{cid}",
                "call_id": cid,
                "name": name,
                "arguments": json.dumps(args),
                "status": "completed",
            }
        )
    return items


def _responses_json(
    reply: Reply, model: str, rid: str, status: str = "completed"
) -> dict[str, Any]:
    done = status == "completed"
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": status,
        "output": _items(reply, rid) if done else [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": _responses_usage(reply.usage) if done else None,
    }


def _responses_events(reply: Reply, model: str, rid: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"type": "response.created", "response": _responses_json(reply, model, rid, "in_progress")}
    ]
    for idx, item in enumerate(_items(reply, rid)):
        if item["type"] == "message":
            full = item["content"][0]["text"]
            empty = {**item, "status": "in_progress", "content": []}
            out.append({"type": "response.output_item.added", "output_index": idx, "item": empty})
            part = {"type": "output_text", "text": "", "annotations": []}
            at = {"item_id": item["id"], "output_index": idx, "content_index": 0}
            out.append({"type": "response.content_part.added", **at, "part": part})
            for piece in _pieces(full):
                out.append({"type": "response.output_text.delta", **at, "delta": piece})
            out.append({"type": "response.output_text.done", **at, "text": full})
            out.append({"type": "response.content_part.done", **at, "part": item["content"][0]})
        else:
            empty = {**item, "status": "in_progress", "arguments": ""}
            out.append({"type": "response.output_item.added", "output_index": idx, "item": empty})
            at = {"item_id": item["id"], "output_index": idx}
            args = item["arguments"]
            out.append({"type": "response.function_call_arguments.delta", **at, "delta": args})
            out.append({"type": "response.function_call_arguments.done", **at, "arguments": args})
        out.append({"type": "response.output_item.done", "output_index": idx, "item": item})
    out.append({"type": "response.completed", "response": _responses_json(reply, model, rid)})
    for seq, event in enumerate(out):
        event["sequence_number"] = seq
    return out


def _demo(body: dict[str, Any], api: str) -> Reply:
    """For ``examples/openai_client.py`` and ``examples/anthropic_client.py``: a model that
    keeps rephrasing a search (a turn is a tool result the conversation carries)."""
    turn = sum(
        1
        for m in body.get("messages") or ()
        if m.get("role") == "tool"
        or any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in m.get("content") or ()
        )
    )
    return tool("search_orders", {"query": f"order 9 attempt {turn}"}, input=400, output=60)


if __name__ == "__main__":  # python tests/integrations/_llm_server.py: serve the demo script
    with LLMServer(_demo) as server:
        print(f"OPENAI_BASE_URL={server.base_url}", flush=True)
        print(f"ANTHROPIC_BASE_URL={server.anthropic_base_url}", flush=True)
        threading.Event().wait()
