"""The one way into span decoding: serialized OTLP request -> :class:`Decoded` slices.

Both OTLP transports (``_otlp`` for gRPC, ``_http``) and every test go through
:func:`decode_slices`. It uses the native decoder when it is available and falls back to the
pure-Python reference (``_pydecode``) for any request the native one does not answer for; the
two give the same observations, so the caller never knows which ran. A malformed request
raises :class:`~guard.errors.InvalidInput`, possibly only at its last slice: a caller that
must apply a request whole or not at all collects every slice before applying any (``_otlp``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from guard.server.decode import _nativedecode as native
from guard.server.decode._pydecode import decode_spans, parse_request, request_spans
from guard.server.decode._schema import Decoded, Observation

__all__ = [
    "Decoded",
    "Observation",
    "decode_payload",
    "decode_request",
    "decode_slices",
    "decode_spans",
]


def decode_slices(data: bytes, max_spans: int) -> Iterator[Decoded]:
    """Decode a serialized ``ExportTraceServiceRequest`` in slices of at most ``max_spans``
    spans, in arrival order. Raises ``InvalidInput`` when the request is malformed.

    Natively when possible; when the native decoder gives up part-way, the reference decodes
    the request from the first span not yet returned (the slices before are exact).
    """
    done = 0  # spans returned so far
    if native.available():
        state: Any = None
        while True:
            got = native.decode(data, state, max_spans)
            if got is None:
                break  # the reference decides, from span `done` on
            observations, spans, state = got
            if spans:
                out = Decoded()
                out.observations = observations
                out.spans = spans
                done += spans
                yield out
            if state is None:
                return
    yield from _reference_slices(parse_request(data), done, max_spans)


def _reference_slices(request: Any, skip: int, max_spans: int) -> Iterator[Decoded]:
    out = Decoded()
    for spans in request_spans(request):
        if skip >= len(spans):
            skip -= len(spans)
            continue
        spans = spans[skip:] if skip else spans
        skip = 0
        start = 0
        while start < len(spans):
            part = spans[start : start + max_spans - out.spans]
            decode_spans(part, out)
            start += len(part)
            if out.spans >= max_spans:
                yield out
                out = Decoded()
    if out.spans:
        yield out


def decode_payload(data: bytes) -> Decoded:
    """Decode every span of a serialized request, in arrival order (one :class:`Decoded`)."""
    whole = Decoded()
    for part in decode_slices(data, 1 << 30):
        whole.extend(part)
    return whole


def decode_request(request: Any) -> Decoded:
    """Decode every span of an ``ExportTraceServiceRequest`` message, in arrival order."""
    return decode_payload(request.SerializeToString())
