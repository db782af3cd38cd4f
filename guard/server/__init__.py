"""The guard service: OTLP ingest, the run registry, decision fan-out, admin and auth.

Layers (each a private module): ``_decode`` (pure OTLP -> observations), ``_registry`` /
``_ingest`` / ``_decisions`` (per-run state and policy routing), ``_tenants`` (rolling
budgets), ``_fanout`` (commands and acks per agent stream), ``_auth``, ``_status`` (the one
error -> gRPC status boundary), and the servicers ``_otlp``, ``_control``, ``_admin``.
"""

from guard.server._app import (
    DEFAULT_DRAIN_S,
    DEFAULT_LISTEN,
    GuardServer,
    ServerThread,
    TlsFiles,
    is_loopback,
)
from guard.server._decode import Observation, decode_request, decode_spans
from guard.server._sinks import MemorySink, NullSink

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
