"""Conversions for the guard's own messages: its commands to agents and its admin answers.

Part of :mod:`guard.wire` (which re-exports every name here); kept apart so each stays
small. The server builds ``guard.v1`` messages only through these functions: an ``Admit``, a
``Directive`` (warn, wrap_up, cancel, deny), an ``Allowance``, a ``RecordAck``, the
``Welcome``, a ``RunStatus`` and a ``TenantBudget``, and the ``GuardAdmin`` answers that
hold them (one replica's run statuses travel between replicas as hex text). Unknown
(``None``) travels as the proto's zero value where the field is not ``optional``, as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from guard._wire_values import limits_to_pb, usage_to_pb
from guard.policy._allowance import AllowanceGrant
from guard.policy._types import Limits, Usage
from guard.v1 import guard_pb2 as pb

__all__ = [
    "admit_to_pb",
    "allowance_to_pb",
    "cancel_response_to_pb",
    "directive_to_pb",
    "envelope_to_pb",
    "guard_batch_to_pb",
    "list_runs_response_to_pb",
    "record_ack_to_pb",
    "run_status_from_hex",
    "run_status_to_hex",
    "run_status_to_pb",
    "stats_response_to_pb",
    "tenant_budget_to_pb",
    "tenant_budgets_response_to_pb",
    "welcome_to_pb",
]

_MAX_TOKENS = float(2**53)  # an allowance's token ceiling is clamped to what an int64 holds


def envelope_to_pb(command_id: int, sent_at_unix: float) -> pb.GuardMessage:
    """An empty ``GuardMessage`` with its command id; the caller sets one body."""
    return pb.GuardMessage(command_id=command_id, sent_at_unix=sent_at_unix)


_ADMIT_LIMITS: dict[Any, pb.Limits] = {}  # effective Limits -> its message (most runs share one)
_ADMIT_LIMITS_MAX = 256
_ADMIT_LAST: list[tuple[Any, Any]] = [(None, None)]  # the last (Limits, message) used


def admit_to_pb(
    run_id: str, request_id: int, effective: Any, price_book_version: str, into: Any = None
) -> Any:
    """An Admit with the run's effective limits. Their message is built once per distinct
    (frozen) ``Limits`` value and copied into each Admit: every admission pays for it else.
    ``into``: an Admit to fill in place (a command's body, see ``AgentSession.compose``)."""
    msg = pb.Admit() if into is None else into
    msg.run_id = run_id
    msg.request_id = request_id
    msg.price_book_version = price_book_version
    # most admissions carry the very Limits object of the one before (the policy's run
    # defaults): the identity check spares hashing its fields
    last = _ADMIT_LAST[0]
    limits = last[1] if last[0] is effective else _ADMIT_LIMITS.get(effective)
    if limits is None:
        limits = limits_to_pb(effective)
        if len(_ADMIT_LIMITS) >= _ADMIT_LIMITS_MAX:
            _ADMIT_LIMITS.clear()  # many distinct limits (requested per run): start over
        _ADMIT_LIMITS[effective] = limits
    _ADMIT_LAST[0] = (effective, limits)
    msg.effective.CopyFrom(limits)
    return msg


def directive_to_pb(
    run_id: str,
    reason: str,
    detail: str,
    utilisation: float | None,
    metric: str | None,
    request_id: int = 0,
) -> pb.Directive:
    return pb.Directive(
        run_id=run_id,
        request_id=request_id,
        reason=reason,
        detail=detail,
        utilisation=utilisation or 0.0,
        metric=metric or "",
    )


def allowance_to_pb(
    grant: AllowanceGrant, *, request_id: int = 0, ttl_s: float = 0.0, into: Any = None
) -> pb.Allowance:
    """A run's grant as an Allowance; ``ttl_s=0`` (the default) tells the SDK it has none
    (unknown run). ``into``: an Allowance to fill in place (a command's body)."""
    msg = pb.Allowance() if into is None else into
    msg.run_id = grant.run_id
    msg.request_id = request_id
    msg.ttl_s = ttl_s
    msg.exhausted = grant.exhausted
    msg.detail = grant.detail
    if grant.max_cost_usd is not None:
        msg.max_cost_usd = grant.max_cost_usd
    if grant.max_tokens is not None:
        msg.max_tokens = int(min(grant.max_tokens, _MAX_TOKENS))
    return msg


def record_ack_to_pb(run_id: str, into: Any = None) -> pb.RecordAck:
    msg = pb.RecordAck() if into is None else into
    msg.run_id = run_id
    return msg


def guard_batch_to_pb(messages: list[pb.GuardMessage]) -> pb.GuardMessage:
    """Several GuardMessages, in order, as one stream message (``accepts_batches`` agents)."""
    return pb.GuardMessage(batch=pb.GuardBatch(messages=messages))


def welcome_to_pb(
    guard_id: str, session_id: str, heartbeat_interval_ms: int, agent_grace_s: int, policy: Any
) -> pb.Welcome:
    """The guard's answer to a Hello; it always reads ``AgentMessage.batch``."""
    return pb.Welcome(
        guard_id=guard_id,
        session_id=session_id,
        heartbeat_interval_ms=heartbeat_interval_ms,
        agent_grace_s=agent_grace_s,
        policy=policy,
        accepts_batches=True,
    )


def run_status_to_pb(
    *,
    run_id: str,
    parent_run_id: str,
    tenant: str,
    agent: str,
    process_id: str,
    usage: Usage,
    limits: Limits,
    elapsed_s: float,
    utilisation: float | None,
    metric: str | None,
    state: str,
    connected: bool,
    guard_id: str = "",
) -> pb.RunStatus:
    return pb.RunStatus(
        run_id=run_id,
        parent_run_id=parent_run_id,
        tenant=tenant,
        agent=agent,
        process_id=process_id,
        usage=usage_to_pb(usage),
        limits=limits_to_pb(limits),
        elapsed_s=elapsed_s,
        utilisation=utilisation or 0.0,
        metric=metric or "",
        state=state,
        connected=connected,
        guard_id=guard_id,
    )


def tenant_budget_to_pb(
    tenant: str,
    *,
    live_runs: int | None = None,
    max_concurrent_runs: int | None = None,
    windows: Any = (),
    exhausted: bool = False,
) -> pb.TenantBudget:
    """``windows``: (metric, window_s, used, limit) tuples. ``live_runs=None``: a tenant the
    guard does not track (beyond the tenants cap): only its name."""
    msg = pb.TenantBudget(tenant=tenant)
    if live_runs is None:
        return msg
    msg.live_runs = max(0, int(live_runs))
    if max_concurrent_runs is not None:
        msg.max_concurrent_runs = int(max_concurrent_runs)
    for metric, window_s, used, limit in windows:
        msg.windows.add(metric=metric, window_s=window_s, used=used, limit=limit)
    msg.exhausted = exhausted
    return msg


# -- GuardAdmin answers --------------------------------------------------------------------
def cancel_response_to_pb(run_ids: Iterable[str]) -> pb.CancelResponse:
    """The runs a Cancel reached (their agents have the cancel; RunEnded records it)."""
    return pb.CancelResponse(run_ids=run_ids)


def list_runs_response_to_pb(statuses: Iterable[pb.RunStatus], total: int) -> pb.ListRunsResponse:
    """At most ``limit`` run statuses (:func:`run_status_to_pb`) and how many runs matched."""
    return pb.ListRunsResponse(runs=statuses, total=total)


def tenant_budgets_response_to_pb(
    tenants: Iterable[pb.TenantBudget],
) -> pb.TenantBudgetsResponse:
    """Tenant budgets (:func:`tenant_budget_to_pb`), one per tenant asked about."""
    return pb.TenantBudgetsResponse(tenants=tenants)


def stats_response_to_pb(guard_id: str, figures: Mapping[str, float]) -> pb.StatsResponse:
    """The guard's named figures (units in their names)."""
    return pb.StatsResponse(guard_id=guard_id, figures=figures)


def run_status_to_hex(status: pb.RunStatus) -> str:
    """A run status as text for a replica's answer to a fleet ListRuns (JSON over Redis)."""
    data: bytes = status.SerializeToString()
    return data.hex()


def run_status_from_hex(text: str) -> pb.RunStatus:
    """The inverse of :func:`run_status_to_hex`; raises ``ValueError`` (or protobuf's
    ``DecodeError``) on text that is not one."""
    status: pb.RunStatus = pb.RunStatus.FromString(bytes.fromhex(text))
    return status
