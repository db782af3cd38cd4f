"""OTLP ``TraceService/Export`` receiver: bytes in, registry update, partial_success out.

:func:`ingest_export` is the decode-and-ingest path shared with the OTLP/HTTP receiver
(``_http``); the gRPC handler here only adds its metadata auth and status mapping.

Registered as a generic handler with no deserializer so that a malformed request becomes a
clear ``INVALID_ARGUMENT`` (grpcio's own deserialisation failure would surface as INTERNAL).
Spans refused individually (bad counters, another tenant's runs, capacity) are reported in
the OTLP ``partial_success`` field, the standard way to say "some of these were rejected".
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp

from guard.errors import GuardError, GuardUnavailable, InvalidInput
from guard.server._auth import Principal
from guard.server._decode import Decoded
from guard.server._rawdecode import LiteRequest, decode_lite_spans, lite_chunks
from guard.server._status import abort_for, status_for

__all__ = [
    "CHUNK_SPANS",
    "SERVICE_NAME",
    "decode_chunk",
    "export_response",
    "ingest_export",
    "parse_export",
    "trace_service_handler",
]

CHUNK_SPANS = 512  # spans decoded or applied between two yields to the event loop

SERVICE_NAME = "opentelemetry.proto.collector.trace.v1.TraceService"
_OK = otlp.ExportTraceServiceResponse().SerializeToString()
_parse = LiteRequest.FromString


def parse_export(data: bytes) -> Any:
    """One parse of an Export body with the fast path's schema; ``InvalidInput`` if malformed.

    It validates the whole request (structure, UTF-8) as the generated class would; its
    schema hands over span attributes as bytes (see _rawdecode), which the decoder validates
    as it reads them.
    """
    try:
        return _parse(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InvalidInput(
            f"malformed OTLP ExportTraceServiceRequest ({len(data)} bytes): {exc}"
        ) from None


def decode_chunk(chunk: list[Any]) -> Decoded:
    """Decode (and so validate) one chunk of ``lite_chunks``; ``InvalidInput`` if malformed."""
    decoded = Decoded()
    for spans in chunk:
        decode_lite_spans(spans, decoded)
    return decoded


async def ingest_export(app: Any, data: bytes, principal: Principal) -> tuple[int, list[str]]:
    """The one ingest path of both OTLP transports (gRPC here, HTTP in ``_http``).

    Parses, decodes and applies one serialized ``ExportTraceServiceRequest`` for
    ``principal``, then awaits ``registry.budgets.sync()``. Returns (rejected spans, the
    first error texts) for ``partial_success``; raises a ``GuardError`` (``InvalidInput`` for
    a malformed body) that refuses the whole request. ``app`` provides ``registry`` and
    ``turns`` (TenantTurns).
    """
    registry = app.registry
    request = parse_export(data)
    # Decode (and so validate) every chunk before applying any: a malformed attribute
    # refuses the whole request, as before. A large request yields to the event loop
    # between chunks, so one 16 MiB batch cannot hold it (and every cancel behind it)
    # for long.
    rejected, errors = 0, []
    pieces = list(lite_chunks(request, CHUNK_SPANS))
    if len(pieces) == 1:  # the usual case: one slice, no trip through the loop
        rejected, errors = registry.ingest(decode_chunk(pieces[0]), principal)
    elif pieces:  # sliced: one such request per tenant at a time (see _fair)
        async with app.turns.turn(principal.tenant):
            chunks: list[Decoded] = []
            for chunk in pieces:
                if chunks:
                    await asyncio.sleep(0)
                chunks.append(decode_chunk(chunk))
            for decoded in chunks:
                await asyncio.sleep(0)  # before each: the last decode ran just before
                r, e = registry.ingest(decoded, principal)
                rejected += r
                errors.extend(e[: max(0, 5 - len(errors))])
    # the one await point of the shared state: a replica's tenant budgets settle
    # this request's per-tenant usage with Redis (in memory: returns at once)
    await registry.budgets.sync()
    return rejected, errors


def export_response(rejected: int, errors: list[str]) -> otlp.ExportTraceServiceResponse:
    """The Export answer: ``partial_success`` set only when spans were rejected (OTLP spec)."""
    resp = otlp.ExportTraceServiceResponse()
    if rejected:
        resp.partial_success.rejected_spans = rejected
        resp.partial_success.error_message = "; ".join(errors)[:1000]
    return resp


def trace_service_handler(app: Any) -> grpc.GenericRpcHandler:
    """Build the TraceService handler bound to a GuardServer-like ``app``.

    ``app`` provides ``auth`` (Authenticator), ``registry``, ``turns`` (TenantTurns),
    ``draining`` and ``export_refusals`` (a Counter: refused requests by status name).
    """
    auth = app.auth

    async def export(data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            if app.draining:
                raise GuardUnavailable("guard is draining; retry against another replica")
            principal = auth.principal(context.invocation_metadata())
            rejected, errors = await ingest_export(app, data, principal)
        except GuardError as exc:
            app.export_refusals[status_for(exc).name] += 1
            await abort_for(context, exc)
        if not rejected:
            return _OK
        return export_response(rejected, errors).SerializeToString()

    return grpc.method_handlers_generic_handler(
        SERVICE_NAME,
        {"Export": grpc.unary_unary_rpc_method_handler(export)},
    )
