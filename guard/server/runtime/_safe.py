"""Service registration whose request decoding cannot fail inside grpc.

When a request deserializer raises, grpcio answers UNKNOWN (or INTERNAL) and logs a
traceback at ERROR: a client's mistake would look like a server bug, once per message. Here
each method handler of a generated ``add_*Servicer_to_server`` function is re-wrapped: its
deserializer returns an :class:`Undecodable` marker instead of raising, and the behaviour
answers that marker with INVALID_ARGUMENT and a one-line reason (for a request stream, the
servicer's iterator raises :class:`~guard.errors.InvalidInput`, which ends the stream with
the same status). ``_otlp`` avoids the issue another way (no deserializer at all).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import grpc

from guard.errors import InvalidInput

__all__ = ["Undecodable", "add_safely"]


class Undecodable:
    """A request body that did not parse (what the servicer gets instead of raising)."""

    __slots__ = ("message",)

    def __init__(self, kind: str, size: int, exc: BaseException) -> None:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        self.message = f"undecodable {kind} ({size} bytes): {reason}"[:500]


def _deserializer(parse: Callable[[bytes], Any] | None, kind: str) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data) if parse is not None else data
        except Exception as exc:  # any failure to parse is the client's
            return Undecodable(kind, len(data), exc)

    return deserialize


async def _checked(requests: Any) -> Any:
    async for msg in requests:
        if isinstance(msg, Undecodable):
            raise InvalidInput(msg.message)
        yield msg


def _unary(fn: Any) -> Any:
    """``fn(request, context)`` that answers an :class:`Undecodable` request itself."""
    bad = grpc.StatusCode.INVALID_ARGUMENT
    if inspect.isasyncgenfunction(getattr(fn, "__func__", fn)):

        async def gen(request: Any, context: Any) -> Any:
            if isinstance(request, Undecodable):
                await context.abort(bad, request.message)
            async for item in fn(request, context):
                yield item

        return gen

    async def call(request: Any, context: Any) -> Any:
        if isinstance(request, Undecodable):
            await context.abort(bad, request.message)
        return await fn(request, context)

    return call


def _streaming(fn: Any) -> Any:
    """``fn(requests, context)`` whose request iterator raises on an undecodable message."""

    async def call(requests: Any, context: Any) -> Any:
        return await fn(_checked(requests), context)

    return call


def _wrap(method: str, h: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    des = _deserializer(h.request_deserializer, method)
    ser = h.response_serializer
    if h.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(_unary(h.unary_unary), des, ser)
    if h.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(_unary(h.unary_stream), des, ser)
    if h.stream_stream is not None:
        return grpc.stream_stream_rpc_method_handler(_streaming(h.stream_stream), des, ser)
    return grpc.stream_unary_rpc_method_handler(_streaming(h.stream_unary), des, ser)


class _Capture:
    """Stands in for a server to collect what a generated ``add_*_to_server`` registers."""

    def __init__(self) -> None:
        self.name = ""
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, name: str, handlers: Any) -> None:
        self.name, self.handlers = name, dict(handlers)


def add_safely(add_to_server: Callable[[Any, Any], None], servicer: Any, server: Any) -> None:
    """``add_to_server(servicer, server)``, with every method's decoding made safe."""
    capture = _Capture()
    add_to_server(servicer, capture)
    handlers = {m: _wrap(f"{capture.name}/{m} request", h) for m, h in capture.handlers.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(capture.name, handlers),))
    server.add_registered_method_handlers(capture.name, handlers)
