"""A recording gRPC proxy: every byte an agent sends to the guard, and every byte back.

A real grpc server on 127.0.0.1:0 with a generic handler and no (de)serializers: each request
body (unary calls and every message of a stream) is recorded as it arrived, forwarded
unchanged to the guard, and so is each response. Point the SDK (or any OTLP exporter) at
``proxy.address`` instead of the guard.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc

_STREAMS = ("/guard.v1.GuardControl/Attach",)


class RecordingProxy(grpc.GenericRpcHandler):
    def __init__(self, upstream: str) -> None:
        self._channel = grpc.insecure_channel(upstream)
        self._lock = threading.Lock()
        self.received: list[tuple[str, bytes]] = []  # (method, body) the guard was sent
        self.sent: list[tuple[str, bytes]] = []  # (method, body) the guard answered
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self._server.add_generic_rpc_handlers((self,))
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def bodies(self, method_suffix: str = "") -> list[bytes]:
        with self._lock:
            return [b for m, b in self.received if m.endswith(method_suffix)]

    def all_bytes(self) -> bytes:
        with self._lock:
            return b"".join(b for _, b in self.received + self.sent)

    def _record(self, box: list[tuple[str, bytes]], method: str, body: bytes) -> bytes:
        with self._lock:
            box.append((method, body))
        return body

    @staticmethod
    def _metadata(context: grpc.ServicerContext) -> list[tuple[str, str]]:
        return [
            (k, v)
            for k, v in context.invocation_metadata()
            if not k.startswith((":", "grpc-")) and k != "user-agent"
        ]

    def service(self, details: Any) -> grpc.RpcMethodHandler:
        method = details.method
        if method in _STREAMS:
            upstream = self._channel.stream_stream(method)

            def stream(requests: Iterator[bytes], context: grpc.ServicerContext):
                ups = (self._record(self.received, method, b) for b in requests)
                call = upstream(ups, metadata=self._metadata(context))
                context.add_callback(call.cancel)
                try:
                    for body in call:
                        yield self._record(self.sent, method, body)
                except grpc.RpcError as exc:
                    if exc.code() is not grpc.StatusCode.CANCELLED:
                        context.abort(exc.code(), exc.details() or "")

            return grpc.stream_stream_rpc_method_handler(stream)
        upstream_unary = self._channel.unary_unary(method)

        def unary(body: bytes, context: grpc.ServicerContext) -> bytes:
            self._record(self.received, method, body)
            try:
                resp = upstream_unary(body, metadata=self._metadata(context), timeout=10)
            except grpc.RpcError as exc:
                with self._lock:
                    self.sent.append((method, (exc.details() or "").encode()))
                context.abort(exc.code(), exc.details() or "")
            return self._record(self.sent, method, resp)

        return grpc.unary_unary_rpc_method_handler(unary)

    def __enter__(self) -> RecordingProxy:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=1).wait(5)
        self._channel.close()
