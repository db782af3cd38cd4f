"""The one boundary where ``guard.errors`` become gRPC status codes.

Servicers raise errors from the tree; :func:`grpc_errors` (a decorator for unary handlers)
and :func:`abort_for` (for stream handlers) translate them. Two refinements of the tree live
here because only the server needs them: :class:`PermissionDenied` (authenticated, but not
allowed) and :class:`UnknownRun` (a well-formed id the guard does not track).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from guard.errors import (
    AuthError,
    BudgetExceeded,
    ConfigError,
    GuardError,
    GuardUnavailable,
    InputTooLarge,
    InvalidInput,
    StoreError,
)

__all__ = [
    "Overloaded",
    "PermissionDenied",
    "UnknownRun",
    "abort_for",
    "grpc_errors",
    "status_for",
]

log = logging.getLogger("guard.server")


class PermissionDenied(AuthError):
    """The caller is authenticated but may not touch this tenant or operation."""


class UnknownRun(InvalidInput):
    """A run id the guard does not track (never seen, or already ended and evicted)."""


class Overloaded(GuardError):
    """A capacity limit (tracked runs, tenants, queue) was reached. ``retry_after_s``: when
    the caller may retry (the span intake's shed requests), else ``None``."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message)


# Most specific first.
_MAP: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (AuthError, grpc.StatusCode.UNAUTHENTICATED),
    (UnknownRun, grpc.StatusCode.NOT_FOUND),
    (InputTooLarge, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (InvalidInput, grpc.StatusCode.INVALID_ARGUMENT),
    (ConfigError, grpc.StatusCode.INVALID_ARGUMENT),
    (Overloaded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (BudgetExceeded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (GuardUnavailable, grpc.StatusCode.UNAVAILABLE),
    (StoreError, grpc.StatusCode.UNAVAILABLE),
    (GuardError, grpc.StatusCode.INTERNAL),
)


def status_for(exc: BaseException) -> grpc.StatusCode:
    for kind, code in _MAP:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


async def abort_for(context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    """Abort the RPC with the status mapped from ``exc`` (raises ``AbortError``)."""
    code = status_for(exc)
    if code is grpc.StatusCode.INTERNAL:
        log.exception("internal error in %s", type(exc).__name__, exc_info=exc)
        await context.abort(code, f"internal error: {type(exc).__name__}: {exc}")
    retry = getattr(exc, "retry_after_s", None)
    if retry is not None:  # OTLP exporters wait this long before retrying (RetryInfo)
        await context.abort(code, str(exc), trailing_metadata=_retry_info(code, str(exc), retry))
    await context.abort(code, str(exc))


def _retry_info(
    code: grpc.StatusCode, message: str, delay_s: float
) -> tuple[tuple[str, bytes], ...]:
    """The trailers carrying a ``google.rpc.RetryInfo``: in the status details (the standard
    place, which the Collector reads) and as ``google.rpc.retryinfo-bin`` of its own (which
    the OpenTelemetry Python exporter reads)."""
    from google.protobuf import any_pb2, duration_pb2
    from google.rpc import error_details_pb2, status_pb2

    delay = duration_pb2.Duration(seconds=int(delay_s), nanos=int(delay_s % 1 * 1e9))
    info = error_details_pb2.RetryInfo(retry_delay=delay)
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=code.value[0], message=message, details=[detail])
    return (
        ("grpc-status-details-bin", status.SerializeToString()),
        ("google.rpc.retryinfo-bin", info.SerializeToString()),
    )


F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def grpc_errors(fn: F) -> F:
    """Decorate an async unary handler ``(self, request, context)`` to map errors."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await fn(self, request, context)
        except GuardError as exc:
            await abort_for(context, exc)
        except (ValueError, TypeError, OverflowError) as exc:
            # protobuf field assignment and conversions: the caller sent something odd
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad request: {exc}")

    return wrapper  # type: ignore[return-value]
