"""Connections of the OTLP/HTTP receiver: aiohttp's request handler with the receiver's
bounds, its answers to malformed requests, and its logging.

- :class:`Connection` (one per TCP connection) admits a connection within the total and
  per-client-IP caps, else answers ``503`` with ``Retry-After`` and closes; it passes every
  byte through :class:`~guard.server.otlp._httpframe.Framing` before aiohttp's parser, so a chunk
  beyond the limits fails the request's body at once (413, or 400 for a malformed
  chunk-size line) instead of being waited for;
- a request aiohttp cannot parse gets a ``google.rpc.Status`` answer (400, or 431 for heads
  over their bounds) and one log line at INFO, never a traceback;
- :class:`LogLimiter` bounds those lines: at most one per kind per interval, the next one
  saying how many were left out;
- no response names the library or its version (``Server: otel-guard``).

All of this runs on the receiver's own event loop, in its thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong
from aiohttp.streams import EmptyStreamReader, StreamReader
from google.protobuf import json_format
from google.rpc import status_pb2

from guard.errors import InputTooLarge, InvalidInput
from guard.server.otlp._httpframe import Framing

__all__ = ["SERVER_NAME", "Connection", "ConnectionCounts", "HttpServer", "LogLimiter", "failure"]

log = logging.getLogger("guard.server")

SERVER_NAME = "otel-guard"  # the Server header: not the library and its version
LOG_INTERVAL_S = 10.0  # one line per kind of client mistake per this many seconds
REFUSED_LINGER_S = 1.0  # a refused connection is closed after this (or when the client is)
_MAX_LINGERING = 64  # refused connections lingering at once; beyond, closed at once
_PROTOBUF = "application/x-protobuf"
_JSON = "application/json"
_UNAVAILABLE = 14  # google.rpc.Code


class BodyRefused(Exception):
    """A body refused by the framing tracker (set on the request's payload)."""


class ChunkTooLarge(BodyRefused, InputTooLarge):
    pass


class BadChunk(BodyRefused, InvalidInput):
    pass


def failure(
    http: int, grpc_code: int, message: str, as_json: bool, headers: dict[str, str]
) -> web.Response:
    """A 4xx/5xx answer: a ``google.rpc.Status`` in the request's content type (OTLP spec)."""
    status = status_pb2.Status(code=grpc_code, message=message[:1000])
    headers = {**headers, "Server": SERVER_NAME}
    if as_json:
        body = json_format.MessageToJson(status, indent=None).encode()
        return web.Response(status=http, body=body, content_type=_JSON, headers=headers)
    return web.Response(
        status=http, body=status.SerializeToString(), content_type=_PROTOBUF, headers=headers
    )


def _one_line(text: str, limit: int = 200) -> str:
    """``text`` on one line (aiohttp's parser errors point at the bad byte with a ``^``)."""
    return " ".join(w for w in text.split() if w.strip("^"))[:limit]


class LogLimiter:
    """At most one log line per kind per ``interval_s``; the next says how many were not
    written. Used from one thread (the receiver's)."""

    def __init__(self, logger: logging.Logger = log, interval_s: float = LOG_INTERVAL_S) -> None:
        self.logger, self.interval_s = logger, interval_s
        self._kinds: dict[str, tuple[float, int]] = {}  # kind -> (last line, left out since)
        self.suppressed = 0  # lines left out in all, for tests and stats

    def emit(self, kind: str, level: int, msg: str, *args: Any, exc_info: Any = None) -> None:
        now = time.monotonic()
        last, left_out = self._kinds.get(kind, (float("-inf"), 0))
        if now - last < self.interval_s:
            self._kinds[kind] = (last, left_out + 1)
            self.suppressed += 1
            return
        self._kinds[kind] = (now, 0)
        if left_out:
            msg += f" ({left_out} more like it in the last {self.interval_s:g}s not logged)"
        self.logger.log(level, msg, *args, exc_info=exc_info)


class ConnectionCounts:
    """Open connections, in all and by client IP (the receiver's thread only)."""

    def __init__(self) -> None:
        self.total = 0
        self.by_ip: dict[str, int] = {}
        self.refused = 0  # connections refused at a cap, since start
        self.lingering = 0

    def admit(self, ip: str, max_total: int, max_per_ip: int) -> str | None:
        """Count the connection in, or say why not."""
        if self.total >= max_total:
            return f"OTLP/HTTP connections at their bound ({max_total}); retry later"
        if self.by_ip.get(ip, 0) >= max_per_ip:
            return f"OTLP/HTTP connections from {ip} at their bound ({max_per_ip}); retry later"
        self.total += 1
        self.by_ip[ip] = self.by_ip.get(ip, 0) + 1
        return None

    def release(self, ip: str) -> None:
        self.total -= 1
        left = self.by_ip.get(ip, 1) - 1
        if left:
            self.by_ip[ip] = left
        else:
            self.by_ip.pop(ip, None)


def _refusal_bytes(message: str, retry_after_s: int) -> bytes:
    body = status_pb2.Status(code=_UNAVAILABLE, message=message).SerializeToString()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        f"Server: {SERVER_NAME}\r\n"
        f"Content-Type: {_PROTOBUF}\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Retry-After: {retry_after_s}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


class Connection(web.RequestHandler):
    """One client connection (see the module docstring). ``receiver`` is the
    :class:`~guard.server.otlp._http.HttpReceiver` (its limits are read per connection and per
    chunk, so a change applies to what comes next)."""

    def __init__(self, manager: web.Server, *, receiver: Any, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.receiver = receiver
        self.ip: str | None = None  # counted in ConnectionCounts while set
        self.refused = False
        self.body_refused = False
        self.framing: Framing | None = None
        self.last_payload: StreamReader | None = None  # of the newest request parsed
        self._linger: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        r = self.receiver
        peer = transport.get_extra_info("peername")
        ip = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        why = r.connections.admit(ip, r.max_connections, r.max_connections_per_ip)
        if why is not None:
            self._refuse(transport, why)  # type: ignore[arg-type]
            return
        self.ip = ip
        self.framing = Framing(lambda: (r.max_body_bytes, r.max_chunks))
        super().connection_made(transport)

    def _refuse(self, transport: asyncio.Transport, why: str) -> None:
        """503 and close, before reading anything; a moment's grace (bounded) lets the
        client read the answer before the close."""
        counts = self.receiver.connections
        counts.refused += 1
        self.refused = True
        self.limiter.emit("connection cap", logging.WARNING, "%s", why)
        transport.write(_refusal_bytes(why, self.receiver.retry_after_s))
        if counts.lingering >= _MAX_LINGERING or not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        counts.lingering += 1
        self._linger = asyncio.get_running_loop().call_later(REFUSED_LINGER_S, transport.close)

    @property
    def limiter(self) -> LogLimiter:
        return self.receiver.log_limiter

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.refused:
            if self._linger is not None:
                self._linger.cancel()
                self._linger = None
                self.receiver.connections.lingering -= 1
            return
        if self.ip is not None:
            self.receiver.connections.release(self.ip)
            self.ip = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.refused or self.body_refused:
            return  # discarded until the close
        framing = self.framing
        verdict = framing.feed(data) if data and framing is not None else None
        if verdict is None:
            self._parse(data)
            return
        upto, status, reason = verdict
        self.body_refused = True
        if upto:
            self._parse(data[:upto])  # the head, if it came with this data
        payload = self.last_payload
        if payload is None or isinstance(payload, EmptyStreamReader) or payload.is_eof():
            # no body in progress: the parser refused the head itself (its answer closes
            # the connection), else the idle timeout does
            return
        # the exception for a reader to come, the EOF for one between two waits (aiohttp's
        # readany() does not look at the exception again once it waits): the reader must
        # check ``exception()`` at the end of the body
        payload.set_exception((ChunkTooLarge if status == 413 else BadChunk)(reason))
        payload.feed_eof()

    def _parse(self, data: bytes) -> None:
        super().data_received(data)
        if self._messages:
            self.last_payload = self._messages[-1][1]

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A request aiohttp refused (malformed, heads over bounds) or a handler failure:
        one rate-limited log line and a ``google.rpc.Status``; the connection is closed."""
        if request.writer.output_size > 0:
            raise ConnectionError("response already started; cannot send an error")
        peer = self.ip or "?"
        if status == 500:
            self.limiter.emit(
                "internal",
                logging.ERROR,
                "OTLP/HTTP: internal error on a request from %s",
                peer,
                exc_info=exc,
            )
            text = "internal error"
        else:
            reason = exc.message if isinstance(exc, HttpProcessingError) else (message or "")
            kind = type(exc).__name__ if exc is not None else f"http {status}"
            if isinstance(exc, LineTooLong) or "too many headers" in str(reason).lower():
                status = 431
            text = _one_line(f"bad HTTP request: {reason}" if reason else "bad HTTP request")
            self.limiter.emit(kind, logging.INFO, "OTLP/HTTP: %s from %s", text, peer)
        code = 3 if status < 500 else 13  # google.rpc INVALID_ARGUMENT / INTERNAL
        resp = failure(status, code, text, False, {})
        resp.force_close()
        return resp

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """aiohttp's other error lines: one rate-limited line, no traceback."""
        exc = kw.get("exc_info")
        if isinstance(exc, BodyRefused):
            return  # the lingering read of a body refused above: answered already
        what = f"{type(exc).__name__}: {exc}" if isinstance(exc, BaseException) else ""
        text = _one_line(f"{args[0] if args else 'error'} {what}")
        self.limiter.emit("connection", logging.WARNING, "OTLP/HTTP: %s", text)


class HttpServer(web.Server):
    """aiohttp's low-level server making :class:`Connection` handlers."""

    def __init__(self, handler: Any, *, receiver: Any, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.receiver = receiver

    def __call__(self) -> Connection:
        kwargs = {**self._kwargs, "keepalive_timeout": self.receiver.idle_timeout_s}
        return Connection(self, loop=self._loop, receiver=self.receiver, **kwargs)
