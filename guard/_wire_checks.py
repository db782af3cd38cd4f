"""Validation of the control stream's guard-bound messages, each as a whole, before any of
it is applied.

Part of :mod:`guard.wire` (which re-exports every name here); kept apart so each stays small.
Raises :class:`guard.errors.InvalidInput` / ``InputTooLarge`` and changes nothing.
"""

from __future__ import annotations

import time

from guard._wire_values import limits_from_pb, usage_from_pb
from guard.bounds import (
    MAX_COST_USD_PER_RECORD,
    MAX_FUTURE_S,
    MAX_ID_CHARS,
    MAX_RUNS_PER_MESSAGE,
    MIN_UNIX_S,
    check_count,
    check_finite,
    check_id,
    check_unix,
)
from guard.errors import InputTooLarge, InvalidInput
from guard.v1 import guard_pb2 as pb

__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_BATCH_MESSAGES",
    "check_allowance_request",
    "check_batch",
    "check_heartbeat",
    "check_hello",
    "check_run_started",
    "ids_fit",
]

MAX_BATCH_MESSAGES = 1024  # messages in one AgentBatch / GuardBatch (the proto says so)
# bytes of the messages of one batch, as guard.wire.take_batch counts them (well under the
# guard's 16 MiB message limit: a backed-up stream must not become one message the peer refuses)
MAX_BATCH_BYTES = 4 << 20


_HEX = "0123456789abcdefABCDEF"


def ids_fit(*ids: str) -> bool:
    """Whether every one of ``ids`` is at most :data:`~guard.bounds.MAX_ID_CHARS` long (the
    one test of the control path's fast checks; ``check_id`` words a failure)."""
    return max(map(len, ids)) <= MAX_ID_CHARS


def _check_trace_hex(name: str, value: str) -> None:
    if value and (len(value) != 32 or value.strip(_HEX)):
        raise InvalidInput(f"{name} {value[:40]!r} is not 32 hex characters")


def check_run_started(rs: pb.RunStarted) -> None:
    """Validate one ``RunStarted`` (or ``Hello.live_runs`` entry) against the bounds.

    Ids and names, the trace id, the start time, the requested limits and the re-registered
    usage; raises ``InvalidInput`` / ``InputTooLarge`` and changes nothing. Once per run on the
    control path: the ids, trace and start time are tested in one expression, and checked one
    by one (:func:`_check_run_started_fields`, whose words they raise) only when one fails.
    """
    run_id, parent, tenant, agent, trace = (
        rs.run_id,
        rs.parent_run_id,
        rs.tenant,
        rs.agent,
        rs.trace_id,
    )
    started = rs.started_at_unix
    if not (
        run_id
        and ids_fit(run_id, parent, tenant, agent)
        and (not trace or (len(trace) == 32 and not trace.strip(_HEX)))
        # NaN fails both comparisons: the checks then say it is not finite
        and (started == 0.0 or MIN_UNIX_S <= started <= time.time() + MAX_FUTURE_S)
    ):
        _check_run_started_fields(rs)
    if rs.HasField("requested"):
        limits_from_pb(rs.requested)
    if rs.HasField("usage"):
        usage_from_pb(rs.usage)


def _check_run_started_fields(rs: pb.RunStarted) -> None:
    check_id("run_started.run_id", rs.run_id, required=True)
    check_id("run_started.parent_run_id", rs.parent_run_id)
    check_id("run_started.tenant", rs.tenant)
    check_id("run_started.agent", rs.agent)
    _check_trace_hex("run_started.trace_id", rs.trace_id)
    check_unix("run_started.started_at_unix", rs.started_at_unix)


def _check_runs_in_message(name: str, n: int) -> None:
    if n > MAX_RUNS_PER_MESSAGE:
        raise InputTooLarge(f"{name} lists {n} runs (max {MAX_RUNS_PER_MESSAGE} per message)")


def check_hello(hello: pb.Hello, *, live_runs: bool = True) -> None:
    """Validate a ``Hello`` whole before any of it is applied. ``live_runs=False`` checks
    their number only: the caller checks each with :func:`check_run_started` (the control
    reader does, in slices that yield to its event loop)."""
    check_id("hello.tenant", hello.tenant)
    check_id("hello.process_id", hello.process_id)
    check_id("hello.host", hello.host)
    check_id("hello.sdk_version", hello.sdk_version)
    _check_runs_in_message("hello.live_runs", len(hello.live_runs))
    for rs in hello.live_runs if live_runs else ():
        check_run_started(rs)


def check_heartbeat(hb: pb.Heartbeat) -> None:
    """Validate a ``Heartbeat``: at most ``MAX_RUNS_PER_MESSAGE`` runs, bounded ids."""
    _check_runs_in_message("heartbeat.runs", len(hb.runs))
    for rp in hb.runs:
        check_id("heartbeat.runs.run_id", rp.run_id)


def check_allowance_request(req: pb.AllowanceRequest) -> None:
    """Validate an ``AllowanceRequest``: its run id, the amounts asked for and the usage."""
    check_id("allowance_request.run_id", req.run_id, required=True)
    check_finite("allowance_request.cost_usd", req.cost_usd, MAX_COST_USD_PER_RECORD)
    check_count("allowance_request.tokens", req.tokens)
    if req.HasField("usage"):
        usage_from_pb(req.usage)


def check_batch(batch: pb.AgentBatch) -> None:
    """Validate an ``AgentBatch`` as a whole (its size, and no Hello or batch inside); each
    message in it is then checked at its turn, as if it had come on its own."""
    n = len(batch.messages)
    if n > MAX_BATCH_MESSAGES:
        raise InputTooLarge(f"batch has {n} messages (max {MAX_BATCH_MESSAGES})")
    for msg in batch.messages:
        body = msg.WhichOneof("body")
        if body in ("hello", "batch") or body is None:
            raise InvalidInput(f"a batch may not hold {body or 'an empty message'}")
    # one C call; take_batch counts the messages alone, so each one's framing (a tag and a
    # length, at most 6 bytes) is allowed on top: no batch it makes is refused here
    size, most = batch.ByteSize(), MAX_BATCH_BYTES + 6 * n
    if size > most:
        raise InputTooLarge(f"batch has {size} bytes (max {most} for {n} messages)")
