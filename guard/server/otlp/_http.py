"""OTLP/HTTP receiver: ``POST /v1/traces`` (``serve --http-listen``), beside the gRPC port.

An aiohttp server on an event loop of its own, in a daemon thread: HTTP parsing, body
reading, gzip inflation and JSON conversion never run on the guard's main loop, so a flood
of span requests does not delay the control plane (control streams, cancels, allowances).
The one call into the guard's state, :func:`guard.server.otlp._grpc.ingest_export` (the one
decode-and-ingest path of both transports, as a gRPC Export), is handed to the main loop and
awaited there; so are the bumps of ``export_refusals``. ``app.draining`` and
``app.auth.principal`` are pure reads and are used in the receiver's thread.

Protocol (opentelemetry-proto ``docs/specification.md``, OTLP/HTTP):

- bodies ``application/x-protobuf`` or ``application/json`` (the OTLP JSON mapping: hex
  trace/span ids, lowerCamelCase keys, enums as integers, int64 as strings or numbers,
  unknown fields ignored); ``Content-Encoding: gzip`` allowed, of one or more members;
- 200 with an ``ExportTraceServiceResponse`` in the request's content type, its
  ``partial_success`` set only when spans were rejected; every 4xx/5xx carries a
  ``google.rpc.Status`` in that content type;
- 400 bad data or a malformed request, 401 no or unknown token, 403 another tenant's scope,
  404 another path, 405 another method, 408 a body slower than ``body_timeout_s``, 413 a body
  (compressed, decompressed, or as announced by its chunks) over ``max_body_bytes`` or of
  more than ``max_chunks`` chunks, 415 another content type or encoding, 431 a head over its
  bounds, 429 (load) and 503 (draining, connection caps) with ``Retry-After``.

Bounds (attributes of :class:`HttpReceiver`, read per connection or request):

- ``max_connections`` (:data:`MAX_CONNECTIONS`) open at once and ``max_connections_per_ip``
  (:data:`MAX_CONNECTIONS_PER_IP`) from one client address: beyond, a new connection gets
  503 with ``Retry-After`` and is closed;
- ``max_requests`` (:data:`MAX_REQUESTS`) being handled at once: beyond, 429;
- bodies held at once, compressed and decompressed, at most ``INFLIGHT_FACTOR`` ×
  ``max_body_bytes`` (``budget``): beyond, 429; gzip is inflated in a worker thread, in steps
  taken from that budget, and refused at ``max_body_bytes`` of output (a bomb costs no more);
- request line and header fields 8 KiB each, 64 headers; ``max_chunks``
  (:data:`MAX_CHUNKS`) chunks per chunked body, no chunk beyond ``max_body_bytes``;
- an idle or slow-header connection is closed after ``idle_timeout_s``, a body not received
  within ``body_timeout_s`` gets 408.

Client mistakes are logged as one line at INFO, at most one per kind every few seconds; no
response names the library or its version.
"""

from __future__ import annotations

import asyncio
import logging
import math
import ssl
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError
from google.protobuf import json_format

from guard.errors import ConfigError, GuardError, GuardUnavailable, InputTooLarge
from guard.server._host import GuardHost
from guard.server.otlp._grpc import export_response, ingest_export
from guard.server.otlp._httpbody import Budget, Hold, gunzip, json_to_export
from guard.server.otlp._httpconn import (
    SERVER_NAME,
    ConnectionCounts,
    HttpServer,
    LogLimiter,
    failure,
)
from guard.server.runtime._status import Overloaded, status_for

__all__ = [
    "BODY_TIMEOUT_S",
    "IDLE_TIMEOUT_S",
    "INFLIGHT_FACTOR",
    "MAX_CHUNKS",
    "MAX_CONNECTIONS",
    "MAX_CONNECTIONS_PER_IP",
    "MAX_REQUESTS",
    "TRACES_PATH",
    "HttpReceiver",
    "http_status_for",
    "json_to_export",
    "server_ssl_context",
]

log = logging.getLogger("guard.server")

TRACES_PATH = "/v1/traces"
BODY_TIMEOUT_S = 30.0  # a body not received within this gets 408 (slow clients)
IDLE_TIMEOUT_S = 15.0  # idle keep-alive, and incomplete headers, are closed after this
INFLIGHT_FACTOR = 4  # bodies held at once, in units of max_body_bytes
MAX_CONNECTIONS = 1024  # open at once; beyond, 503
MAX_CONNECTIONS_PER_IP = 256  # from one client address (a sidecar's clients share loopback)
MAX_REQUESTS = 256  # handled at once; beyond, 429
MAX_CHUNKS = 8192  # of one chunked body; beyond, 413
RETRY_AFTER_S = 1
_OFF_LOOP_BYTES = 64 * 1024  # JSON bodies from this size are converted in the worker
_MAX_FIELD_BYTES = 8190
_MAX_HEADERS = 64
_PROTOBUF = "application/x-protobuf"
_JSON = "application/json"

# HTTP status of a refused request, from its gRPC status (the one mapping, ``_status``); the
# gRPC code itself rides in the answer's Status.code.
_HTTP = {
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.NOT_FOUND: 400,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,  # load (capacity, budgets): retry later
    grpc.StatusCode.UNAVAILABLE: 503,
}


class _Refusal(Exception):
    """A transport-level refusal (path, method, media type) with its HTTP status."""

    def __init__(self, http: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.http, self.headers = http, headers or {}


class _Shed(Exception):
    """The span intake's refusal of a request not read (already counted): ``args[0]``."""


def http_status_for(exc: BaseException) -> int:
    if isinstance(exc, InputTooLarge):  # RESOURCE_EXHAUSTED of size, not of load: no retry
        return 413
    return _HTTP.get(status_for(exc), 500)


class HttpReceiver:
    """The OTLP/HTTP listener of a GuardServer-like ``app`` (``auth``, ``intake``,
    ``registry``, ``draining``, ``export_refusals``). ``await start()`` (on the guard's main
    loop) starts the receiver's thread, binds and serves; ``await stop()`` lets in-flight
    requests finish within its grace, then closes and ends the thread."""

    # The connection limits, the same for every receiver (a test may set them on one).
    max_connections = MAX_CONNECTIONS
    max_connections_per_ip = MAX_CONNECTIONS_PER_IP
    max_requests = MAX_REQUESTS
    max_chunks = MAX_CHUNKS
    retry_after_s = RETRY_AFTER_S

    def __init__(
        self,
        app: GuardHost,
        listen: str,
        *,
        max_body_bytes: int,
        ssl_context: ssl.SSLContext | None = None,
        body_timeout_s: float = BODY_TIMEOUT_S,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        self.app = app
        self.listen = listen
        self.max_body_bytes = int(max_body_bytes)
        self.ssl_context = ssl_context
        self.body_timeout_s = body_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.budget = Budget(INFLIGHT_FACTOR * self.max_body_bytes)
        self.connections = ConnectionCounts()  # the receiver's thread only
        self.log_limiter = LogLimiter()  # the receiver's thread only
        self.active = 0  # requests being handled (the receiver's thread only)
        self.port = 0
        self._runner: web.BaseRunner | None = None
        self._worker: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main_loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._refusals: Counter[str] = Counter()  # not yet added to app.export_refusals
        self._shed = [0, 0]  # requests and bytes shed here, not yet counted by the intake
        self._refusals_lock = threading.Lock()
        self._flush_scheduled = False

    @property
    def address(self) -> str:
        return f"{self.listen.rsplit(':', 1)[0]}:{self.port}"

    # -- lifecycle (called on the main loop) -------------------------------------------------
    async def start(self, grace_s: float) -> HttpReceiver:
        host, _, port = self.listen.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"--http-listen must be HOST:PORT, got {self.listen!r}", path="http")
        self._main_loop = asyncio.get_running_loop()
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run, args=(loop,), name="otel-guard-http", daemon=True
        )
        self._thread.start()
        try:
            await self._on_http_loop(self._serve(host.strip("[]"), int(port), grace_s))
        except BaseException:
            await self._end_thread()
            raise
        return self

    async def stop(self, grace_s: float) -> None:
        """Stop accepting; in-flight requests get ``grace_s`` (new ones see ``draining``)."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        try:
            await asyncio.wait_for(self._on_http_loop(runner.cleanup()), timeout=grace_s + 1.0)
        except Exception:  # a timeout included: stopping must go on
            log.warning("OTLP/HTTP receiver did not close cleanly", exc_info=True)
        await self._end_thread()
        self._flush_refusals()

    def _on_http_loop(self, coro: Any) -> asyncio.Future[Any]:
        assert self._loop is not None
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def _end_thread(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join, 10.0)
        if self._worker is not None:
            self._worker.shutdown(wait=False, cancel_futures=True)
        self._loop = self._thread = None

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        finally:
            loop.close()

    # -- the receiver's loop -------------------------------------------------------------------
    async def _serve(self, host: str, port: int, grace_s: float) -> None:
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="otel-guard-http-body")
        server = HttpServer(
            self._handle,
            receiver=self,
            access_log=None,
            max_line_size=_MAX_FIELD_BYTES,
            max_field_size=_MAX_FIELD_BYTES,
            max_headers=_MAX_HEADERS,
            auto_decompress=False,  # decompressed here, bounded (see gunzip)
        )
        runner = web.ServerRunner(server, shutdown_timeout=grace_s)
        await runner.setup()
        site = web.TCPSite(runner, host, port, ssl_context=self.ssl_context)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise GuardUnavailable(f"could not bind --http-listen {self.listen}: {exc}") from None
        self._runner = runner
        self.port = runner.addresses[0][1]

    async def _in_worker(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)

    def _count_refusal(self, name: str, shed_bytes: int | None = None) -> None:
        """``app.export_refusals[name] += 1`` on the main loop (the Counter is not
        thread-safe): queued here, added there by one pending callback at most. With
        ``shed_bytes``: a request shed here for the span intake, counted in its stats too."""
        with self._refusals_lock:
            self._refusals[name] += 1
            if shed_bytes is not None:
                self._shed[0] += 1
                self._shed[1] += shed_bytes
            if self._flush_scheduled:
                return
            self._flush_scheduled = True
        try:
            assert self._main_loop is not None
            self._main_loop.call_soon_threadsafe(self._flush_refusals)
        except RuntimeError:  # the main loop is closed: nobody reads them any more
            pass

    def _flush_refusals(self) -> None:
        with self._refusals_lock:
            counts, self._refusals = self._refusals, Counter()
            (shed, size), self._shed = self._shed, [0, 0]
            self._flush_scheduled = False
        self.app.export_refusals.update(counts)
        if shed:
            self.app.intake.count_shed(shed, size)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        media = request.content_type  # lowercased, parameters (charset) stripped
        as_json = media == _JSON
        try:
            body = await self._export(request, media)
        except _Refusal as exc:
            resp = failure(exc.http, 0, str(exc), as_json, exc.headers)
        except (GuardError, _Shed) as exc:
            counted = isinstance(exc, _Shed)
            exc = exc.args[0] if counted else exc
            code = status_for(exc)
            if not counted:
                self._count_refusal(code.name)
            http = http_status_for(exc)
            if http == 500:
                self.log_limiter.emit(
                    "internal", logging.ERROR, "internal error in OTLP/HTTP export", exc_info=exc
                )
            headers = {}
            if http in (429, 503):
                retry = getattr(exc, "retry_after_s", None) or self.retry_after_s
                headers["Retry-After"] = str(max(1, math.ceil(retry)))
            if http == 401:
                headers["WWW-Authenticate"] = "Bearer"
            resp = failure(http, code.value[0], str(exc), as_json, headers)
        else:
            resp = web.Response(body=body, content_type=media, headers={"Server": SERVER_NAME})
        content = request.content
        if not content.is_eof() or content.exception() is not None:
            resp.force_close()  # the body was not read to its end: the connection cannot go on
        return resp

    async def _export(self, request: web.BaseRequest, media: str) -> bytes:
        if request.path != TRACES_PATH:
            raise _Refusal(
                404, f"no such path {request.path[:100]!r}; OTLP traces go to /v1/traces"
            )
        if request.method != "POST":
            raise _Refusal(405, f"{request.method[:20]} not allowed; use POST", {"Allow": "POST"})
        app = self.app
        if app.draining:
            raise GuardUnavailable("guard is draining; retry against another replica")
        if self.active >= self.max_requests:
            raise Overloaded(
                f"OTLP/HTTP requests in flight at their bound ({self.max_requests}); retry later"
            )
        self.active += 1
        try:
            return await self._admitted(request, media)
        finally:
            self.active -= 1

    async def _admitted(self, request: web.BaseRequest, media: str) -> bytes:
        app = self.app
        principal = app.auth.principal(
            [("authorization", v) for v in request.headers.getall("Authorization", [])][:1]
        )
        if media not in (_PROTOBUF, _JSON):
            raise _Refusal(415, f"content type {media[:60]!r}: use {_PROTOBUF} or {_JSON}")
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("identity", "gzip"):
            raise _Refusal(415, f"content encoding {encoding[:40]!r}: use gzip or none")
        limit = self.max_body_bytes
        size = request.content_length
        if size is not None and size > limit:
            raise InputTooLarge(f"body of {size} bytes exceeds max_body_bytes {limit}")
        if size is not None and (shed := app.intake.refusal(principal.tenant, size)) is not None:
            self._count_refusal("RESOURCE_EXHAUSTED", shed_bytes=size)
            raise _Shed(shed)  # before the body is read: a flood costs its headers only
        hold = Hold(self.budget)
        try:
            if size is not None:
                hold.take(size)  # a slow body holds what it announced
            if request.headers.get("Expect", "").lower() == "100-continue":
                await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            data = await self._read(request, limit, None if size is not None else hold)
            if encoding == "gzip":
                compressed = len(data)
                data = await self._in_worker(gunzip, data, limit, hold.take)
                hold.give(compressed)  # the compressed bytes are no longer held
            if media == _JSON:
                if len(data) >= _OFF_LOOP_BYTES:
                    data = await self._in_worker(json_to_export, data)
                else:
                    data = json_to_export(data)
            assert self._main_loop is not None
            rejected, errors = await asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(
                    ingest_export(app, data, principal), self._main_loop
                )
            )
        finally:
            hold.release()
        resp = export_response(rejected, errors)
        if media == _JSON:
            return json_format.MessageToJson(resp, indent=None).encode()
        return resp.SerializeToString()

    async def _read(self, request: web.BaseRequest, limit: int, hold: Hold | None) -> bytes:
        """The body, at most ``limit`` bytes; ``hold`` (no Content-Length) takes each piece."""
        parts: list[bytes] = []
        total = 0
        content = request.content
        try:
            async with asyncio.timeout(self.body_timeout_s):
                while piece := await content.readany():
                    total += len(piece)
                    if total > limit:
                        raise InputTooLarge(f"body exceeds max_body_bytes {limit}")
                    if hold is not None:
                        hold.take(len(piece))
                    parts.append(piece)
                if (exc := content.exception()) is not None:
                    raise exc  # the body was refused by its framing (see Connection)
        except TimeoutError:
            raise _Refusal(408, f"body not received within {self.body_timeout_s:g}s") from None
        except RequestPayloadError as exc:
            raise _Refusal(400, f"malformed body: {exc}") from None
        except ConnectionError:  # the client went away: nobody reads the answer
            raise _Refusal(400, "connection lost while reading the body") from None
        return b"".join(parts)


def server_ssl_context(cert: str, key: str, client_ca: str | None) -> ssl.SSLContext:
    """The same PEM files as the gRPC port; with ``client_ca`` client certificates are
    required (mTLS), as there."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(cert, key)
        if client_ca:
            ctx.load_verify_locations(client_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load TLS files for --http-listen: {exc}", path="tls") from None
    return ctx
