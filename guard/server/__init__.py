"""The guard service: servicers that only adapt, over parts with explicit interfaces.

One subpackage per part: ``otlp`` (the OTLP receivers and the fair intake queue),
``decode`` (span decoding over one schema; the native decoder is ``decode._nativedecode``),
``applier`` (observations applied to runs; the native loop is ``applier._nativeapply``), ``runs``
(the run table, per-run state, admission, run ends, re-registration), ``decisions`` (the
decision router), ``control`` (the control stream and its fan-out), ``admin``
(``GuardAdmin``), the shared-state parts ``tenants``, ``directory`` and ``bus`` (the
interfaces in ``_parts``; each in memory and in Redis, the replicas' connection in
``_redis``), ``sinks`` and ``runtime`` (auth, the error -> gRPC status boundary, metrics, the
collector's pauses). ``_compose`` is the one composition root that builds a guard from its
parts, and ``_app`` starts, drains and stops it. Protobuf messages are built through
:mod:`guard.wire`; ``import guard.server`` does not load the store (records live in
:mod:`guard.records`).
"""

from guard.server._app import (
    DEFAULT_DRAIN_S,
    DEFAULT_LISTEN,
    GuardServer,
    ServerThread,
    TlsFiles,
    is_loopback,
)
from guard.server.decode._decode import Observation, decode_request, decode_spans
from guard.server.sinks._memory import MemorySink, NullSink

__all__ = [
    "DEFAULT_DRAIN_S",
    "DEFAULT_LISTEN",
    "GuardServer",
    "MemorySink",
    "NullSink",
    "Observation",
    "ServerThread",
    "TlsFiles",
    "decode_request",
    "decode_spans",
    "is_loopback",
]
