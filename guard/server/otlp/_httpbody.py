"""Request bodies of the OTLP/HTTP receiver: the bytes-in-flight budget, bounded gzip
inflation and the OTLP/JSON conversion.

Everything here runs in the receiver's own thread or its inflation worker, never on the
guard's main loop. The budget is shared by both threads and so takes a lock.
"""

from __future__ import annotations

import base64
import json
import threading
import zlib
from collections.abc import Callable
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp

from guard.errors import InputTooLarge, InvalidInput
from guard.server.runtime._status import Overloaded

__all__ = ["Budget", "Hold", "gunzip", "json_to_export"]

_INFLATE_STEP = 256 * 1024  # output of one inflate call: the budget is taken in these steps


class Budget:
    """Bytes of request bodies held at once, compressed and decompressed, across requests.

    Taken by the receiver's thread and its inflation worker: a lock guards ``held``."""

    def __init__(self, cap: int) -> None:
        self.cap, self.held = cap, 0
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        with self._lock:
            if self.held + n > self.cap:
                raise Overloaded(
                    f"OTLP/HTTP bodies in flight at their bound ({self.held} + {n} > "
                    f"{self.cap} bytes); retry later"
                )
            self.held += n

    def give(self, n: int) -> None:
        with self._lock:
            self.held -= n


class Hold:
    """One request's share of the :class:`Budget`; ``release()`` gives all of it back."""

    def __init__(self, budget: Budget) -> None:
        self.budget, self.n = budget, 0

    def take(self, n: int) -> None:
        self.budget.take(n)
        self.n += n

    def give(self, n: int) -> None:
        n = min(n, self.n)
        self.budget.give(n)
        self.n -= n

    def release(self) -> None:
        self.give(self.n)


def gunzip(data: bytes, limit: int, take: Callable[[int], None]) -> bytes:
    """Inflate a gzip body (every member: RFC 1952 allows several) to at most ``limit`` bytes.

    Streaming, ``_INFLATE_STEP`` bytes of output at a time, each taken from the budget by
    ``take`` before more is inflated: a bomb costs ``limit`` bytes and is refused with
    ``InputTooLarge`` there, a body the budget cannot hold with ``Overloaded``. Zero bytes
    after the last member (padding, as ``gzip`` accepts) are ignored.
    """
    out: list[bytes] = []
    size = 0
    rest = data
    while True:
        d = zlib.decompressobj(wbits=31)
        buf = rest
        try:
            while True:
                piece = d.decompress(buf, min(_INFLATE_STEP, limit + 1 - size))
                if piece:
                    size += len(piece)
                    if size > limit:
                        raise InputTooLarge(
                            f"gzip body decompresses to more than max_body_bytes {limit}"
                        )
                    take(len(piece))
                    out.append(piece)
                buf = d.unconsumed_tail
                if d.eof or (not buf and not piece):
                    break
        except zlib.error as exc:
            raise InvalidInput(
                f"gzip body ({len(data)} bytes) does not decompress: {exc}"
            ) from None
        if not d.eof:
            raise InvalidInput(f"gzip body ({len(data)} bytes) is truncated")
        rest = d.unused_data
        if not rest.strip(b"\0"):
            return b"".join(out)


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
