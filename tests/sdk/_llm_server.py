"""A tiny OpenAI-compatible HTTP server for tests: ``POST /v1/chat/completions`` on 127.0.0.1:0.

Each answer is scripted by the test (``LLMServer(replies=...)``): a list of dicts with the
usage to report (``prompt_tokens``, ``completion_tokens``, ``cached_tokens``,
``reasoning_tokens``) and optionally ``tool_calls`` (``[(name, arguments_dict), ...]``) or
``content``; the last reply repeats once the list runs out. ``requests`` counts the calls.
Standard library only (``http.server`` in a thread): no network beyond loopback, no key.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["LLMServer"]


class LLMServer:
    """``with LLMServer(replies) as srv:`` ... ``srv.base_url`` is ``http://127.0.0.1:PORT/v1``."""

    def __init__(self, replies: list[dict[str, Any]] | None = None) -> None:
        self.replies = list(replies or [{"prompt_tokens": 10, "completion_tokens": 2}])
        self.requests = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                if not self.path.endswith("/chat/completions"):
                    self.send_error(404)
                    return
                out = json.dumps(server.answer(body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            n = self.requests
            self.requests += 1
        r = self.replies[min(n, len(self.replies) - 1)]
        message: dict[str, Any] = {"role": "assistant", "content": r.get("content", "ok")}
        if r.get("tool_calls"):
            message["content"] = None
            message["tool_calls"] = [
                {
                    "id": f"call_{n}_{i}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
                for i, (name, args) in enumerate(r["tool_calls"])
            ]
        prompt, completion = r["prompt_tokens"], r["completion_tokens"]
        return {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": body.get("model", "gpt-4.1"),
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": r.get("cached_tokens", 0)},
                "completion_tokens_details": {"reasoning_tokens": r.get("reasoning_tokens", 0)},
            },
        }

    def __enter__(self) -> LLMServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
