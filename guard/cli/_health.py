"""`otel-guard health`: ask a guard's grpc.health.v1.Health service whether it is serving.

The container image's HEALTHCHECK runs it; Kubernetes probes the same service natively. Exit
status 0 when the answer is SERVING, 1 otherwise: NOT_SERVING (starting, draining, or records
that cannot be made durable), an unknown service, no answer within ``--timeout-s``, or no
guard at ``--endpoint``. One line says the status and the endpoint.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_arguments", "check", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from guard.cli._client import add_endpoint_arguments

    add_endpoint_arguments(parser)
    parser.add_argument(
        "--service",
        default="",
        help="the service to check, e.g. guard.v1.GuardControl (default '': the whole guard)",
    )
    parser.add_argument(
        "--timeout-s", type=float, default=3.0, help="give up after this many seconds (default 3)"
    )


def check(
    endpoint: str | None, *, service: str = "", timeout_s: float = 3.0, tls_ca: str | None = None
) -> tuple[str, str, str]:
    """One Health/Check call. Returns ``(status, endpoint, detail)``: status is a
    ``ServingStatus`` name (``SERVING``, ``NOT_SERVING``, ``SERVICE_UNKNOWN``, ``UNKNOWN``) or
    ``UNREACHABLE`` when the call failed, and detail the gRPC error then (else '')."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from guard.cli._client import AdminClient

    # The admin commands' client resolves the endpoint (env default, scheme prefixes) and
    # builds the channel, TLS included; health needs no token, so none is sent.
    client = AdminClient(endpoint, token="", tls_ca=tls_ca, timeout_s=timeout_s)
    try:
        stub = health_pb2_grpc.HealthStub(client.channel)
        try:
            resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            if code == grpc.StatusCode.NOT_FOUND:  # the servicer's answer for an unknown name
                return "SERVICE_UNKNOWN", client.endpoint, ""
            detail = exc.details() if hasattr(exc, "details") else str(exc)
            return "UNREACHABLE", client.endpoint, f"{code.name}: {detail}"
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
        return status, client.endpoint, ""
    finally:
        client.close()


def run(args: argparse.Namespace) -> int:
    status, endpoint, detail = check(
        args.endpoint, service=args.service, timeout_s=args.timeout_s, tls_ca=args.tls_ca
    )
    what = f"service {args.service!r} at {endpoint}" if args.service else endpoint
    line = f"otel-guard health: {what} is {status}" + (f" ({detail})" if detail else "")
    if status == "SERVING":
        print(line, flush=True)
        return 0
    print(line, file=sys.stderr, flush=True)
    return 1
