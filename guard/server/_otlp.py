"""OTLP ``TraceService/Export`` receiver: bytes in, registry update, partial_success out.

Registered as a generic handler with no deserializer so that a malformed request becomes a
clear ``INVALID_ARGUMENT`` (grpcio's own deserialisation failure would surface as INTERNAL).
Spans refused individually (bad counters, another tenant's runs, capacity) are reported in
the OTLP ``partial_success`` field, the standard way to say "some of these were rejected".
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp

from guard.errors import AuthError, GuardUnavailable, InvalidInput
from guard.server._decode import decode_request
from guard.server._status import abort_for

__all__ = ["SERVICE_NAME", "trace_service_handler"]

SERVICE_NAME = "opentelemetry.proto.collector.trace.v1.TraceService"
_OK = otlp.ExportTraceServiceResponse().SerializeToString()
_parse = otlp.ExportTraceServiceRequest.FromString


def trace_service_handler(app: Any) -> grpc.GenericRpcHandler:
    """Build the TraceService handler bound to a GuardServer-like ``app``.

    ``app`` provides ``auth`` (Authenticator), ``registry`` and ``draining``.
    """
    auth = app.auth
    registry = app.registry

    async def export(data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            if app.draining:
                raise GuardUnavailable("guard is draining; retry against another replica")
            principal = auth.principal(context.invocation_metadata())
            try:
                request = _parse(data)
            except (DecodeError, RuntimeError, ValueError) as exc:
                raise InvalidInput(
                    f"malformed OTLP ExportTraceServiceRequest ({len(data)} bytes): {exc}"
                ) from None
            decoded = decode_request(request)
            rejected, errors = registry.ingest(decoded, principal)
        except (AuthError, InvalidInput, GuardUnavailable) as exc:
            await abort_for(context, exc)
        if not rejected:
            return _OK
        resp = otlp.ExportTraceServiceResponse()
        resp.partial_success.rejected_spans = rejected
        resp.partial_success.error_message = "; ".join(errors)[:1000]
        return resp.SerializeToString()

    return grpc.method_handlers_generic_handler(
        SERVICE_NAME,
        {"Export": grpc.unary_unary_rpc_method_handler(export)},
    )
