"""The composition root: the one place a guard is assembled from its parts.

Reading this module top to bottom gives the whole object graph of one guard process:

1. :func:`assemble` builds the parts that live as long as the process, in dependency order:
   the authenticator, the shared-state parts (in memory, or a replica's Redis parts when a
   URL is given: :func:`~guard.server._parts.parts_for`), the run registry (which builds the
   run-side parts around them: the run table, the span applier, the decision router, the
   ways out, re-registration and admission), the fair span intake in front of the applier,
   the per-tenant turns of the control stream, the policy as the agents receive it, the
   health servicer and the event-loop lag probe.
2. :func:`register_services` puts the transports that only adapt over those parts onto one
   gRPC server: OTLP, ``GuardControl``, ``GuardAdmin``, health and reflection.
3. :func:`http_receiver` and :func:`guard_metrics` build the optional parts (OTLP/HTTP beside
   the gRPC port; the OpenTelemetry metrics) once the server knows its settings.

:class:`~guard.server._app.GuardServer` owns the lifecycle (start, drain, stop) of what is
built here, and is the host the servicers are given.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from guard.policy import MetricsSettings, PolicyConfig
from guard.server._parts import parts_for
from guard.server.admin._admin import AdminServicer
from guard.server.control._stream import ControlServicer
from guard.server.control._stream import add_to_server as add_control
from guard.server.otlp._grpc import SERVICE_NAME as OTLP_SERVICE
from guard.server.otlp._grpc import trace_service_handler
from guard.server.otlp._intake import SpanIntake
from guard.server.runs._registry import Registry
from guard.server.runtime._auth import Authenticator
from guard.server.runtime._fair import TenantTurns
from guard.server.runtime._looplag import LoopLag
from guard.server.runtime._safe import add_safely
from guard.v1 import guard_pb2, guard_pb2_grpc
from guard.wire import policy_to_pb

if TYPE_CHECKING:  # pragma: no cover
    from guard.server._app import GuardServer
    from guard.server._host import GuardHost

    def _conforms(server: GuardServer) -> GuardHost:
        """Never called: the type checker holds the server to the host its servicers see."""
        return server


__all__ = ["Assembly", "assemble", "guard_metrics", "http_receiver", "register_services"]


@dataclass(frozen=True, slots=True)
class Assembly:
    """The process-long parts of one guard, built by :func:`assemble`."""

    auth: Authenticator
    registry: Registry
    intake: SpanIntake
    turns: TenantTurns  # one sliced control message per tenant at a time
    policy_pb: Any  # the policy as the agents receive it (guard.v1.Policy)
    health: HealthServicer
    loop_lag: LoopLag


def assemble(
    config: PolicyConfig,
    sink: Any,
    *,
    guard_id: str,
    environ: Mapping[str, str] | None = None,
    redis_url: str | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Assembly:
    """Build one guard's parts for ``config``, writing records to ``sink``.

    ``redis_url`` (checked by the caller) makes this guard the replica ``guard_id`` of
    several, sharing tenant budgets, the run directory and the directive bus through Redis;
    without it they are kept in memory. Nothing starts here: the server starts the parts.
    """
    auth = Authenticator(config.auth, environ)
    parts = parts_for(config, redis_url=redis_url, guard_id=guard_id)
    registry = Registry(config, sink, guard_id=guard_id, clock=clock, parts=parts)
    # every span request of both transports: admitted per tenant, applied in slices
    intake = SpanIntake(registry.ingest, config.guard.max_queued_span_bytes, registry.stats)
    return Assembly(
        auth=auth,
        registry=registry,
        intake=intake,
        turns=TenantTurns(),
        policy_pb=policy_to_pb(config),
        health=HealthServicer(),
        loop_lag=LoopLag(),
    )


def register_services(server: grpc.aio.Server, app: GuardHost, health: HealthServicer) -> list[str]:
    """Add every service to ``server`` over the host ``app`` (the :class:`GuardServer`).

    Returns the full names of OTLP, GuardControl, GuardAdmin and health, in that order (the
    names the health servicer reports on). Request bodies that do not parse get
    INVALID_ARGUMENT, not UNKNOWN and a traceback (:func:`add_safely`).
    """
    server.add_generic_rpc_handlers((trace_service_handler(app),))
    add_safely(add_control, ControlServicer(app), server)  # batches go out as bytes
    add_safely(guard_pb2_grpc.add_GuardAdminServicer_to_server, AdminServicer(app), server)
    add_safely(health_pb2_grpc.add_HealthServicer_to_server, health, server)
    services = guard_pb2.DESCRIPTOR.services_by_name
    names = [
        OTLP_SERVICE,
        services["GuardControl"].full_name,
        services["GuardAdmin"].full_name,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
    ]
    reflection.enable_server_reflection((*names, reflection.SERVICE_NAME), server)
    return names


def http_receiver(app: GuardHost, listen: str, max_body_bytes: int, tls: Any) -> Any:
    """OTLP/HTTP on ``listen`` beside the gRPC port, over the same intake (TLS as gRPC's)."""
    from guard.server.otlp._http import HttpReceiver, server_ssl_context

    ctx = None
    if tls is not None:
        ctx = server_ssl_context(tls.cert, tls.key, tls.client_ca)
    return HttpReceiver(app, listen, max_body_bytes=max_body_bytes, ssl_context=ctx)


def guard_metrics(app: GuardHost, settings: MetricsSettings) -> Any:
    """The guard's OpenTelemetry metrics, started (a bad exporter address fails here)."""
    from guard.server.runtime._metrics import GuardMetrics

    return GuardMetrics(app, settings).start()
