"""A small synchronous GuardAdmin client shared by ``cancel``, ``runs`` and ``report``.

``--endpoint`` defaults to ``$OTEL_GUARD_ENDPOINT`` else 127.0.0.1:4317; ``--token`` to
``$OTEL_GUARD_ADMIN_TOKEN``. gRPC failures become ``guard.errors`` with the server's text.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import grpc

from guard.errors import AuthError, GuardError, GuardUnavailable, InvalidInput
from guard.v1 import guard_pb2 as pb
from guard.v1 import guard_pb2_grpc

__all__ = ["DEFAULT_ENDPOINT", "AdminClient", "add_client_arguments", "client_from_args"]

DEFAULT_ENDPOINT = "127.0.0.1:4317"

_ERRORS: dict[grpc.StatusCode, type[GuardError]] = {
    grpc.StatusCode.UNAUTHENTICATED: AuthError,
    grpc.StatusCode.PERMISSION_DENIED: AuthError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidInput,
    grpc.StatusCode.NOT_FOUND: InvalidInput,
    grpc.StatusCode.UNAVAILABLE: GuardUnavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: GuardUnavailable,
}


def add_endpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """--endpoint and --tls-ca: where the running guard is and how to verify it."""
    parser.add_argument(
        "--endpoint",
        default=None,
        help="guard HOST:PORT (default $OTEL_GUARD_ENDPOINT, else 127.0.0.1:4317)",
    )
    parser.add_argument("--tls-ca", default=None, help="PEM CA to verify a TLS guard")


def add_client_arguments(parser: argparse.ArgumentParser) -> None:
    """--endpoint, --token, --tls-ca, --timeout for commands that talk to a running guard."""
    add_endpoint_arguments(parser)
    parser.add_argument(
        "--token", default=None, help="admin or tenant token (default $OTEL_GUARD_ADMIN_TOKEN)"
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="RPC timeout in seconds")


def client_from_args(args: argparse.Namespace) -> AdminClient:
    return AdminClient(
        args.endpoint,
        token=args.token,
        tls_ca=getattr(args, "tls_ca", None),
        timeout_s=getattr(args, "timeout", 10.0),
    )


class AdminClient:
    """Blocking GuardAdmin calls. ``close()`` when done (or use as a context manager)."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        token: str | None = None,
        tls_ca: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        env_endpoint = os.environ.get("OTEL_GUARD_ENDPOINT", "")
        endpoint = endpoint or env_endpoint or DEFAULT_ENDPOINT
        for prefix in ("http://", "https://", "grpc://"):
            if endpoint.startswith(prefix):
                endpoint = endpoint[len(prefix) :]
        self.endpoint = endpoint
        token = token if token is not None else os.environ.get("OTEL_GUARD_ADMIN_TOKEN")
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout = timeout_s
        if tls_ca:
            with open(tls_ca, "rb") as fh:
                creds = grpc.ssl_channel_credentials(root_certificates=fh.read())
            self._channel = grpc.secure_channel(endpoint, creds)
        else:
            self._channel = grpc.insecure_channel(endpoint)
        self._stub = guard_pb2_grpc.GuardAdminStub(self._channel)
        # With replicas, the last answer's "otel-guard-partial" trailer: which replicas did not
        # answer a fleet query (the answer holds what the others said), else None.
        self.partial: str | None = None

    def _call(self, method: str, request: Any) -> Any:
        try:
            resp, call = getattr(self._stub, method).with_call(
                request, metadata=self._metadata, timeout=self._timeout
            )
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            kind = _ERRORS.get(code, GuardError)
            detail = exc.details() if hasattr(exc, "details") else str(exc)
            raise kind(f"{method} on {self.endpoint}: {code.name}: {detail}") from None
        trailer = dict(call.trailing_metadata() or ())
        self.partial = trailer.get("otel-guard-partial")
        return resp

    def cancel(
        self,
        *,
        run_id: str | None = None,
        tenant: str | None = None,
        agent: str | None = None,
        all: bool = False,
        reason: str = "",
    ) -> list[str]:
        """Cancel by exactly one selector; returns the run ids that were live."""
        chosen: list[tuple[str, Any]] = [
            (k, v)
            for k, v in (("run_id", run_id), ("tenant", tenant), ("agent", agent), ("all", all))
            if v
        ]
        if len(chosen) != 1:
            raise InvalidInput("give exactly one of run_id, tenant, agent, all")
        selector = pb.Selector(**dict(chosen))
        resp = self._call("Cancel", pb.CancelRequest(selector=selector, reason=reason))
        return list(resp.run_ids)

    def list_runs(
        self, *, tenant: str = "", agent: str = "", limit: int = 0, local: bool = False
    ) -> pb.ListRunsResponse:
        req = pb.ListRunsRequest(tenant=tenant, agent=agent, limit=limit, local=local)
        return self._call("ListRuns", req)

    def tenant_budgets(self, tenant: str = "") -> pb.TenantBudgetsResponse:
        return self._call("TenantBudgets", pb.TenantBudgetsRequest(tenant=tenant))

    def report(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        tenant: str = "",
        agent: str = "",
        bucket_s: int = 0,
    ) -> pb.ReportResponse:
        req = pb.ReportRequest(tenant=tenant or "", agent=agent or "", bucket_s=bucket_s)
        if since is not None:
            req.since_unix = since
        if until is not None:
            req.until_unix = until
        return self._call("Report", req)

    @property
    def channel(self) -> grpc.Channel:
        """The channel to the guard, for other services on the same port (health)."""
        return self._channel

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
