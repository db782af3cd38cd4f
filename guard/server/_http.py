"""OTLP/HTTP receiver: ``POST /v1/traces`` (``serve --http-listen``), beside the gRPC port.

An ``aiohttp.web`` application run by an ``AppRunner`` in the guard's own event loop, so a
request is applied to the registry exactly as a gRPC Export is: the transport only adapts
(auth header, content type, encoding, size) and hands the serialized request to
:func:`guard.server._otlp.ingest_export`, the one decode-and-ingest path of both.

Protocol (opentelemetry-proto ``docs/specification.md``, OTLP/HTTP):

- bodies ``application/x-protobuf`` or ``application/json`` (the OTLP JSON mapping: hex
  trace/span ids, lowerCamelCase keys, enums as integers, int64 as strings or numbers,
  unknown fields ignored); ``Content-Encoding: gzip`` allowed;
- 200 with an ``ExportTraceServiceResponse`` in the request's content type, its
  ``partial_success`` set only when spans were rejected; every 4xx/5xx carries a
  ``google.rpc.Status`` in that content type;
- 400 bad data, 401 no or unknown token, 403 another tenant's scope, 404 another path, 405
  another method, 408 a body slower than :data:`BODY_TIMEOUT_S`, 413 a body (compressed or
  not) over ``max_body_bytes``, 415 another content type or encoding, 429 (load) and 503
  (draining) with ``Retry-After``.

Bounds: request line and header fields 8 KiB each, 64 headers; an idle or slow-header
connection is closed after :data:`IDLE_TIMEOUT_S`; the bodies being processed at once hold at
most :data:`INFLIGHT_FACTOR` × ``max_body_bytes`` (compressed plus decompressed), beyond
which a request gets 429 instead of more memory.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import ssl
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from aiohttp import web
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp

from guard.errors import ConfigError, GuardError, GuardUnavailable, InputTooLarge, InvalidInput
from guard.server._otlp import export_response, ingest_export
from guard.server._status import Overloaded, status_for

__all__ = [
    "BODY_TIMEOUT_S",
    "IDLE_TIMEOUT_S",
    "INFLIGHT_FACTOR",
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
RETRY_AFTER_S = 1
_OFF_LOOP_BYTES = 64 * 1024  # bodies from this size are decompressed / converted off the loop
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


def http_status_for(exc: BaseException) -> int:
    if isinstance(exc, InputTooLarge):  # RESOURCE_EXHAUSTED of size, not of load: no retry
        return 413
    return _HTTP.get(status_for(exc), 500)


def _hex_to_b64(obj: dict[str, Any], *keys: str) -> None:
    """OTLP/JSON carries ids as hex; the protobuf JSON mapping expects base64."""
    for key in keys:
        value = obj.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise InvalidInput(f"OTLP/JSON {key} must be a hex string, got {type(value).__name__}")
        try:
            raw = bytes.fromhex(value)
        except ValueError:
            raise InvalidInput(f"OTLP/JSON {key} {value[:40]!r} is not hex") from None
        obj[key] = base64.b64encode(raw).decode()


def _items(obj: Any, *keys: str) -> list[Any]:
    if not isinstance(obj, dict):
        return []
    for key in keys:
        value = obj.get(key)
        if isinstance(value, list):
            return value
    return []


def json_to_export(body: bytes) -> bytes:
    """An OTLP/JSON ``ExportTraceServiceRequest`` as protobuf bytes; ``InvalidInput`` if bad.

    The proto3 JSON mapping (``json_format``, unknown fields ignored) after turning the hex
    ids of spans and links into the mapping's base64. Original snake_case keys are accepted
    too, as ``json_format`` does (the spec forbids senders to use them; being lenient costs
    nothing here).
    """
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:
        if not body.strip():  # no telemetry at all: a success, as an empty protobuf body
            return b""
        raise InvalidInput(f"malformed OTLP/JSON body ({len(body)} bytes): {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidInput(f"OTLP/JSON body must be an object, got {type(doc).__name__}")
    for rs in _items(doc, "resourceSpans", "resource_spans"):
        for ss in _items(rs, "scopeSpans", "scope_spans"):
            for sp in _items(ss, "spans"):
                if not isinstance(sp, dict):
                    continue  # json_format names the bad element
                _hex_to_b64(sp, "traceId", "trace_id", "spanId", "span_id")
                _hex_to_b64(sp, "parentSpanId", "parent_span_id")
                for link in _items(sp, "links"):
                    if isinstance(link, dict):
                        _hex_to_b64(link, "traceId", "trace_id", "spanId", "span_id")
    msg = otlp.ExportTraceServiceRequest()
    try:
        json_format.ParseDict(doc, msg, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
        reason = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        raise InvalidInput(f"invalid OTLP/JSON ExportTraceServiceRequest: {reason}") from None
    return msg.SerializeToString()


def _gunzip(data: bytes, limit: int) -> bytes:
    """Decompress a gzip body to at most ``limit`` bytes: a zip bomb costs ``limit``, no more."""
    d = zlib.decompressobj(wbits=31)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as exc:
        raise InvalidInput(f"gzip body ({len(data)} bytes) does not decompress: {exc}") from None
    if len(out) > limit:
        raise InputTooLarge(f"gzip body decompresses to more than max_body_bytes {limit}")
    if not d.eof:
        raise InvalidInput(f"gzip body ({len(data)} bytes) is truncated")
    return out


class _Budget:
    """Bytes of request bodies held at once (single event loop: no lock needed)."""

    def __init__(self, cap: int) -> None:
        self.cap, self.held = cap, 0

    def take(self, n: int) -> None:
        if self.held + n > self.cap:
            raise Overloaded(
                f"OTLP/HTTP bodies in flight at their bound ({self.held} + {n} > {self.cap} "
                "bytes); retry later"
            )
        self.held += n


class HttpReceiver:
    """The OTLP/HTTP listener of a GuardServer-like ``app`` (``auth``, ``registry``, ``turns``,
    ``draining``, ``export_refusals``). ``await start()`` binds and serves; ``await stop()``
    lets in-flight requests finish within its grace, then closes."""

    def __init__(
        self,
        app: Any,
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
        self.budget = _Budget(INFLIGHT_FACTOR * self.max_body_bytes)
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._worker: ThreadPoolExecutor | None = None

    @property
    def address(self) -> str:
        return f"{self.listen.rsplit(':', 1)[0]}:{self.port}"

    async def start(self, grace_s: float) -> HttpReceiver:
        host, _, port = self.listen.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"--http-listen must be HOST:PORT, got {self.listen!r}", path="http")
        webapp = web.Application(client_max_size=self.max_body_bytes)
        webapp.router.add_route("*", "/{tail:.*}", self._handle)
        webapp.on_response_prepare.append(_server_header)
        runner = web.AppRunner(
            webapp,
            access_log=None,
            shutdown_timeout=grace_s,
            keepalive_timeout=self.idle_timeout_s,
            max_line_size=_MAX_FIELD_BYTES,
            max_field_size=_MAX_FIELD_BYTES,
            max_headers=_MAX_HEADERS,
            auto_decompress=False,  # decompressed here, bounded (see _gunzip)
        )
        await runner.setup()
        site = web.TCPSite(runner, host.strip("[]"), int(port), ssl_context=self.ssl_context)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise GuardUnavailable(f"could not bind --http-listen {self.listen}: {exc}") from None
        self._runner = runner
        self.port = runner.addresses[0][1]
        return self

    async def stop(self, grace_s: float) -> None:
        """Stop accepting; in-flight requests get ``grace_s`` (new ones see ``draining``)."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        try:
            await asyncio.wait_for(runner.cleanup(), timeout=grace_s + 1.0)
        except Exception:  # a timeout included: stopping must go on
            log.warning("OTLP/HTTP receiver did not close cleanly", exc_info=True)
        if self._worker is not None:
            self._worker.shutdown(wait=False, cancel_futures=True)

    async def _off_loop(self, fn: Any, data: bytes, *args: Any) -> bytes:
        """``fn(data, *args)``; a large body's on the receiver's one worker thread.

        JSON conversion runs at about 6k spans/s (pure Python in ``json_format``) and a 16 MiB
        gzip body inflates for tens of ms: on the loop either would hold every cancel behind
        it. In the worker the loop gets the GIL back at each switch interval (5 ms), and one
        thread serialises such bodies (the in-flight budget bounds the queue)."""
        if len(data) < _OFF_LOOP_BYTES:
            return fn(data, *args)
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="otel-guard-http")
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, data, *args)

    # -- one request -----------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.Response:
        media = request.content_type  # lowercased, parameters (charset) stripped
        as_json = media == _JSON
        try:
            body = await self._export(request, media)
        except _Refusal as exc:
            return _failure(exc.http, 0, str(exc), as_json, exc.headers)
        except GuardError as exc:
            self.app.export_refusals[status_for(exc).name] += 1
            code = http_status_for(exc)
            if code == 500:
                log.exception("internal error in OTLP/HTTP export", exc_info=exc)
            headers = {"Retry-After": str(RETRY_AFTER_S)} if code in (429, 503) else {}
            if code == 401:
                headers["WWW-Authenticate"] = "Bearer"
            return _failure(code, status_for(exc).value[0], str(exc), as_json, headers)
        return web.Response(body=body, content_type=media)

    async def _export(self, request: web.Request, media: str) -> bytes:
        if request.path != TRACES_PATH:
            raise _Refusal(
                404, f"no such path {request.path[:100]!r}; OTLP traces go to /v1/traces"
            )
        if request.method != "POST":
            raise _Refusal(405, f"{request.method[:20]} not allowed; use POST", {"Allow": "POST"})
        app = self.app
        if app.draining:
            raise GuardUnavailable("guard is draining; retry against another replica")
        principal = app.auth.principal(
            [("authorization", v) for v in request.headers.getall("Authorization", [])][:1]
        )
        if media not in (_PROTOBUF, _JSON):
            raise _Refusal(415, f"content type {media[:60]!r}: use {_PROTOBUF} or {_JSON}")
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("identity", "gzip"):
            raise _Refusal(415, f"content encoding {encoding[:40]!r}: use gzip or none")
        size = request.content_length
        if size is not None and size > self.max_body_bytes:
            raise InputTooLarge(
                f"body of {size} bytes exceeds max_body_bytes {self.max_body_bytes}"
            )
        held = size if size is not None else self.max_body_bytes
        self.budget.take(held)
        try:
            try:
                async with asyncio.timeout(self.body_timeout_s):
                    data = await request.read()
            except web.HTTPRequestEntityTooLarge:
                raise InputTooLarge(f"body exceeds max_body_bytes {self.max_body_bytes}") from None
            except TimeoutError:
                raise _Refusal(408, f"body not received within {self.body_timeout_s:g}s") from None
            if encoding == "gzip":
                self.budget.take(self.max_body_bytes)
                held += self.max_body_bytes
                data = await self._off_loop(_gunzip, data, self.max_body_bytes)
            if media == _JSON:
                data = await self._off_loop(json_to_export, data)
            rejected, errors = await ingest_export(app, data, principal)
        finally:
            self.budget.held -= held
        resp = export_response(rejected, errors)
        if media == _JSON:
            return json_format.MessageToJson(resp, indent=None).encode()
        return resp.SerializeToString()


async def _server_header(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Server"] = "otel-guard"  # not the library and its version


def _failure(
    http: int, grpc_code: int, message: str, as_json: bool, headers: dict[str, str]
) -> web.Response:
    """A 4xx/5xx answer: a ``google.rpc.Status`` in the request's content type (OTLP spec)."""
    status = status_pb2.Status(code=grpc_code, message=message[:1000])
    if as_json:
        body = json_format.MessageToJson(status, indent=None).encode()
        return web.Response(status=http, body=body, content_type=_JSON, headers=headers)
    return web.Response(
        status=http, body=status.SerializeToString(), content_type=_PROTOBUF, headers=headers
    )


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
