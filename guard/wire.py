"""Conversions between the wire contract (``guard.v1``) and the policy value types.

Shared by the SDK and the server, so both sides agree field by field. The functions live in
the parts this module imports and re-exports (the ``guard._wire_*`` modules), which import only
``guard.v1``, ``guard.bounds``, ``guard.errors`` and ``guard.policy``, never this module.
Conventions (proto header): an unset ``optional`` field is ``None`` ("unknown or disabled"),
never zero; empty strings on the wire are ``None`` in Python for optional text fields
(``parent_run_id``, ``last_tool``, ``last_action_hash``).

Functions raise :class:`guard.errors.InvalidInput` on values that cannot be represented
(unknown status or reason strings, negative or non-finite counters) or that are outside the
bounds of :mod:`guard.bounds` (ids, texts, counters, costs, timestamps; sizes raise its
subclass ``InputTooLarge``). The ``check_*`` functions validate the guard-bound messages of
the control stream as a whole, before any of them is applied.
"""

from __future__ import annotations

# The parts, each a module of its own: the policy values (limits, usage, prices, policy), which
# the others build on; the control stream's checks and batches; the guard's commands and its
# admin answers; the termination record. None of them imports this module.
from guard._wire_batch import MAX_BATCH_BYTES, encode_batch, take_batch, take_encoded
from guard._wire_checks import (
    MAX_BATCH_MESSAGES,
    check_allowance_request,
    check_batch,
    check_heartbeat,
    check_hello,
    check_run_started,
)
from guard._wire_commands import (
    admit_to_pb,
    allowance_to_pb,
    cancel_response_to_pb,
    directive_to_pb,
    envelope_to_pb,
    guard_batch_to_pb,
    list_runs_response_to_pb,
    record_ack_to_pb,
    run_status_from_hex,
    run_status_to_hex,
    run_status_to_pb,
    stats_response_to_pb,
    tenant_budget_to_pb,
    tenant_budgets_response_to_pb,
    welcome_to_pb,
)
from guard._wire_outcome import outcome_from_pb, outcome_to_pb
from guard._wire_values import (
    limits_from_pb,
    limits_to_pb,
    policy_from_pb,
    policy_to_pb,
    price_book_from_pb,
    price_book_to_pb,
    usage_from_pb,
    usage_to_pb,
)

__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_BATCH_MESSAGES",
    "admit_to_pb",
    "allowance_to_pb",
    "cancel_response_to_pb",
    "check_allowance_request",
    "check_batch",
    "check_heartbeat",
    "check_hello",
    "check_run_started",
    "directive_to_pb",
    "encode_batch",
    "envelope_to_pb",
    "guard_batch_to_pb",
    "limits_from_pb",
    "limits_to_pb",
    "list_runs_response_to_pb",
    "outcome_from_pb",
    "outcome_to_pb",
    "policy_from_pb",
    "policy_to_pb",
    "price_book_from_pb",
    "price_book_to_pb",
    "record_ack_to_pb",
    "run_status_from_hex",
    "run_status_to_hex",
    "run_status_to_pb",
    "stats_response_to_pb",
    "take_batch",
    "take_encoded",
    "tenant_budget_to_pb",
    "tenant_budgets_response_to_pb",
    "usage_from_pb",
    "usage_to_pb",
    "welcome_to_pb",
]
