"""The guard service: servicers that only adapt, over parts with explicit interfaces.

Parts (each a private module): ``_decode`` (the one way into span decoding: the native
decoder ``_nativedecode`` or the reference ``_pydecode``, over the schema ``_schema``);
``_table`` (the run table: indexes by id, trace and tenant, capacity, ended ids); ``_ingest``
(the span applier: the fused per-request loop, its per-request state in ``Touched``);
``_registry`` with ``_decisions`` / ``_lifecycle`` / ``_rejoin`` (admission, the decision
router that builds every ``DecisionRecord``, the ways a run ends, re-registration);
``_parts`` (the shared-state interfaces ``TenantBudgets``, ``RunDirectory`` and
``DirectiveBus``, with the in-memory implementations ``_tenants`` + ``_allowances``, the run
table's session ownership and in-process ``AgentSession`` delivery, chosen at start);
``_fanout`` (commands and acks per agent stream), ``_auth``, ``_status`` (the one error ->
gRPC status boundary), and the servicers ``_otlp``, ``_control``, ``_admin``. Protobuf
messages are built through :mod:`guard.wire`; ``import guard.server`` does not load the
store (records live in :mod:`guard.records`).
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
