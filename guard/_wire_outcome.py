"""The termination record on the wire: ``guard.v1.Outcome`` <-> policy :class:`Outcome`.

Part of :mod:`guard.wire` (which re-exports both names). :func:`outcome_from_pb` runs once per
``RunEnded`` on the guard's control path, so it reads each field once, tests every bound in
one expression and builds the record positionally. Only when a bound fails does it run the
checks one by one (:func:`_check_outcome`, the order they always ran in), which raise the
first failure's words: a valid record costs one pass, an invalid one gets exactly the refusal
it always got (``tests/server/test_wire_outcome.py`` holds the two equal).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from guard._wire_checks import ids_fit
from guard._wire_values import _usage_counters, usage_from_pb, usage_to_pb
from guard.bounds import (
    MAX_COST_USD_PER_RECORD,
    MAX_COUNTER,
    MAX_FUTURE_S,
    MAX_ID_CHARS,
    MAX_TEXT_CHARS,
    MIN_UNIX_S,
    check_count,
    check_id,
    check_text,
    check_unix,
)
from guard.errors import InvalidInput
from guard.policy._types import USAGE_COUNTERS, DecidedBy, Outcome, Reason, Status
from guard.v1 import guard_pb2 as pb

if TYPE_CHECKING:  # pragma: no cover
    from enum import Enum

__all__ = ["outcome_from_pb", "outcome_to_pb"]


def outcome_to_pb(outcome: Outcome) -> pb.Outcome:
    """Policy :class:`Outcome` -> ``guard.v1.Outcome``."""
    msg = pb.Outcome(
        run_id=outcome.run_id,
        parent_run_id=outcome.parent_run_id or "",
        tenant=outcome.tenant or "",
        agent=outcome.agent or "",
        status=str(Status(outcome.status).value),
        reason=str(Reason(outcome.reason).value),
        # cut to the bounds the guard enforces, so a long exception text or tool name is
        # never a record the guard must refuse (the agent would resend it forever)
        message=(outcome.message or "")[:MAX_TEXT_CHARS],
        usage=usage_to_pb(outcome.usage),
        elapsed_ms=max(0, int(outcome.elapsed_ms)),
        last_tool=(outcome.last_tool or "")[:MAX_ID_CHARS],
        last_action_hash=outcome.last_action_hash or "",
        loop_hits=max(0, int(outcome.loop_hits)),
        partial_result=bool(outcome.partial_result),
        recoverable=bool(outcome.recoverable),
        decided_by=str(DecidedBy(outcome.decided_by).value),
        price_book_version=outcome.price_book_version or "",
        started_at_unix=float(outcome.started_at),
        ended_at_unix=float(outcome.ended_at),
        trace_id=outcome.trace_id or "",
    )
    if outcome.deadline_ms is not None:
        msg.deadline_ms = max(0, int(outcome.deadline_ms))
    return msg


def _enum(kind: type[Enum], field: str, value: str, default: object = None) -> object:
    if not value and default is not None:
        return default
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(m.value for m in kind)
        raise InvalidInput(f"outcome.{field} {value!r} is not one of: {allowed}") from None


_OUTCOME_IDS = (
    "parent_run_id",
    "tenant",
    "agent",
    "status",
    "reason",
    "last_tool",
    "last_action_hash",
    "decided_by",
    "price_book_version",
    "trace_id",
)
_STATUS = {m.value: m for m in Status}
_REASON = {m.value: m for m in Reason}
_DECIDED_BY = {m.value: m for m in DecidedBy}
_DECIDED_BY[""] = DecidedBy.SDK  # not sent: the SDK's
# outcome_from_pb builds the record positionally, in this order
_FIELDS = (
    *("run_id", "status", "reason", "message", "parent_run_id", "tenant", "agent", "trace_id"),
    *USAGE_COUNTERS,
    *("cost_usd", "elapsed_ms", "deadline_ms", "last_tool", "last_action_hash", "loop_hits"),
    *("partial_result", "recoverable", "decided_by", "price_book_version"),
    *("started_at", "ended_at"),
)
assert tuple(f.name for f in dataclasses.fields(Outcome)) == _FIELDS


def _check_outcome(msg: pb.Outcome) -> None:
    """Every bound of an Outcome, one by one, in order: raises the first that fails."""
    check_id("outcome.run_id", msg.run_id, required=True)
    for name in _OUTCOME_IDS:
        check_id(f"outcome.{name}", getattr(msg, name))
    check_text("outcome.message", msg.message)
    usage_from_pb(msg.usage)
    check_unix("outcome.started_at_unix", msg.started_at_unix)
    check_unix("outcome.ended_at_unix", msg.ended_at_unix)
    check_count("outcome.elapsed_ms", msg.elapsed_ms)
    if msg.HasField("deadline_ms"):
        check_count("outcome.deadline_ms", msg.deadline_ms)
    _enum(Status, "status", msg.status)
    _enum(Reason, "reason", msg.reason)
    _enum(DecidedBy, "decided_by", msg.decided_by, DecidedBy.SDK)


def outcome_from_pb(msg: pb.Outcome) -> Outcome:
    """``guard.v1.Outcome`` -> policy :class:`Outcome`.

    Raises :class:`InvalidInput` (``InputTooLarge`` for sizes) for a missing run_id, a field
    outside :mod:`guard.bounds` or an unknown status/reason/decided_by.
    """
    run_id, parent, tenant, agent = msg.run_id, msg.parent_run_id, msg.tenant, msg.agent
    status, reason, decided_by = msg.status, msg.reason, msg.decided_by
    last_tool, last_hash, version = msg.last_tool, msg.last_action_hash, msg.price_book_version
    trace, message = msg.trace_id, msg.message
    usage = msg.usage
    counters = _usage_counters(usage)  # uint64 fields: ints >= 0
    cost = usage.cost_usd if usage.HasField("cost_usd") else None
    started, ended, elapsed = msg.started_at_unix, msg.ended_at_unix, msg.elapsed_ms
    deadline = msg.deadline_ms if msg.HasField("deadline_ms") else None
    st, why, by = _STATUS.get(status), _REASON.get(reason), _DECIDED_BY.get(decided_by)
    latest = time.time() + MAX_FUTURE_S
    # NaN fails every comparison below, so it takes the checks' path (and their words) too
    if not (
        run_id
        and ids_fit(run_id, parent, tenant, agent, last_tool, last_hash, version, trace)
        and len(message) <= MAX_TEXT_CHARS
        and max(counters) <= MAX_COUNTER
        and (cost is None or 0.0 <= cost <= MAX_COST_USD_PER_RECORD)
        and (started == 0.0 or MIN_UNIX_S <= started <= latest)
        and (ended == 0.0 or MIN_UNIX_S <= ended <= latest)
        and elapsed <= MAX_COUNTER
        and (deadline is None or deadline <= MAX_COUNTER)
        and st is not None
        and why is not None
        and by is not None
    ):
        _check_outcome(msg)  # raises what failed, in the checks' order
        assert st is not None and why is not None and by is not None  # (it raised otherwise)
    return Outcome(
        run_id,
        st,
        why,
        message,
        parent or None,
        tenant,
        agent,
        trace,
        *counters,
        cost,
        elapsed,
        deadline,
        last_tool or None,
        last_hash or None,
        msg.loop_hits,
        msg.partial_result,
        msg.recoverable,
        by,
        version,
        started,
        ended,
    )
