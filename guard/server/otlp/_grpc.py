"""OTLP ``TraceService/Export`` receiver: bytes in, registry update, partial_success out.

:func:`ingest_export` is the decode-and-ingest path shared with the OTLP/HTTP receiver
(``_http``); the gRPC handler here only adds its metadata auth and status mapping.

Registered as a generic handler with no deserializer so that a malformed request becomes a
clear ``INVALID_ARGUMENT`` (grpcio's own deserialisation failure would surface as INTERNAL).
Spans refused individually (bad counters, another tenant's runs, capacity) are reported in
the OTLP ``partial_success`` field, the standard way to say "some of these were rejected".
"""

from __future__ import annotations

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp

from guard.errors import GuardError, GuardUnavailable
from guard.server._host import GuardHost
from guard.server.otlp._intake import SLICE_SPANS
from guard.server.runtime._auth import Principal
from guard.server.runtime._status import abort_for, status_for

__all__ = [
    "CHUNK_SPANS",
    "SERVICE_NAME",
    "export_response",
    "ingest_export",
    "trace_service_handler",
]

CHUNK_SPANS = SLICE_SPANS  # spans decoded or applied between two yields to the event loop

SERVICE_NAME = "opentelemetry.proto.collector.trace.v1.TraceService"
_OK = otlp.ExportTraceServiceResponse().SerializeToString()


async def ingest_export(app: GuardHost, data: bytes, principal: Principal) -> tuple[int, list[str]]:
    """The one ingest path of both OTLP transports (gRPC here, HTTP in ``_http``).

    Hands one serialized ``ExportTraceServiceRequest`` of ``principal`` to the span intake
    (``app.intake``, :class:`~guard.server.otlp._intake.SpanIntake`: admitted by size per tenant,
    decoded and applied in slices by its worker), then awaits ``registry.budgets.sync()``.
    Returns (rejected spans, the first error texts) for ``partial_success``; raises a
    ``GuardError`` that refuses the whole request (``InvalidInput`` for a malformed body,
    ``Overloaded`` with a retry delay when the tenant's share of the queue is full).
    """
    rejected, errors = await app.intake.export(data, principal)
    # the one await point of the shared state: a replica's tenant budgets settle
    # this request's per-tenant usage with Redis (in memory: returns at once)
    await app.registry.budgets.sync()
    return rejected, errors


def export_response(rejected: int, errors: list[str]) -> otlp.ExportTraceServiceResponse:
    """The Export answer: ``partial_success`` set only when spans were rejected (OTLP spec)."""
    resp = otlp.ExportTraceServiceResponse()
    if rejected:
        resp.partial_success.rejected_spans = rejected
        resp.partial_success.error_message = "; ".join(errors)[:1000]
    return resp


def trace_service_handler(app: GuardHost) -> grpc.GenericRpcHandler:
    """Build the TraceService handler bound to a GuardServer-like ``app``.

    ``app`` provides ``auth`` (Authenticator), ``registry``, ``intake`` (SpanIntake),
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
