"""A ``RunEnded`` from the wire: clocks mended, then accepted, or refused on its own.

One agent process carries all its runs on one control stream, and the SDK resends a record
until it is acknowledged. So a record the guard cannot accept must not end the stream (the
records sent after it would be lost, and the resend after each reconnect would end every
new stream in turn): it is answered with a ``Reject`` naming the run, the reason and the
status code; the refused record goes to the sink's dead letter when it has one (else one
WARNING line); and the stream goes on.

Timestamps are the exception: an agent whose clock is off (a day ahead, ten years behind)
sent a true record with wrong times, so :func:`mend_clock` replaces each timestamp outside
:func:`timestamp_ok`'s bounds by the guard's receive time and says so in the record's
message (the record is kept, its times are the guard's). Only what cannot be mended (a bad
status, a counter past :mod:`guard.bounds`, an oversized id) is refused.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any

from google.protobuf import text_format

from guard.bounds import MAX_FUTURE_S, MAX_ID_CHARS, MAX_RECORD_AGE_S, MAX_TEXT_CHARS, MIN_UNIX_S
from guard.errors import InvalidInput
from guard.policy import DecidedBy, Reason, Status
from guard.server.control._clocks import SKEW_NOTABLE_S
from guard.server.runtime._memtrim import after_refusal
from guard.server.runtime._status import status_for
from guard.wire import outcome_from_pb

if TYPE_CHECKING:  # pragma: no cover
    from guard.server.control._fanout import AgentSession
    from guard.server.runtime._auth import Principal
    from guard.v1 import guard_pb2 as pb

__all__ = [
    "MAX_REASON_CHARS",
    "end_record",
    "mend_clock",
    "mend_started",
    "refuse_message",
    "timestamp_ok",
]

log = logging.getLogger("guard.server")
MAX_REASON_CHARS = 512  # Reject.reason: one line, enough for any bound's words
_MAX_RAW_CHARS = 64 * 1024  # the refused record's text kept in the dead letter


def timestamp_ok(value: float, now: float) -> bool:
    """0 (unset), or a finite time within ``now - MAX_RECORD_AGE_S .. now + MAX_FUTURE_S``
    (and not before 2000-01-01): anything else is a broken agent clock."""
    if value == 0.0:
        return True
    earliest = max(MIN_UNIX_S, now - MAX_RECORD_AGE_S)
    return math.isfinite(value) and earliest <= value <= now + MAX_FUTURE_S


def mend_clock(outcome: pb.Outcome, now: float) -> bool:
    """Replace, in place, each timestamp of ``outcome`` that :func:`timestamp_ok` refuses:
    ``ended_at_unix`` by ``now`` (the guard's receive time), ``started_at_unix`` by the end
    minus the run's ``elapsed_ms`` (the agent's monotonic clock is right even when its wall
    clock is not), and append a note naming the replaced values to the message. True when
    anything was replaced."""
    started, ended = outcome.started_at_unix, outcome.ended_at_unix
    bad_start, bad_end = not timestamp_ok(started, now), not timestamp_ok(ended, now)
    if not (bad_start or bad_end):
        return False
    notes = []
    if bad_end:
        notes.append(f"ended_at_unix {ended!r}")
        outcome.ended_at_unix = ended = now
    if bad_start:
        notes.append(f"started_at_unix {started!r}")
        end = ended or now
        elapsed_s = outcome.elapsed_ms / 1000.0
        outcome.started_at_unix = end - elapsed_s if elapsed_s <= end - MIN_UNIX_S else end
    note = (
        f" [guard: agent clock out of bounds; {' and '.join(notes)} replaced by the guard's "
        f"receive time {now:.3f}]"
    )
    # a message already too long is refused with its own words; else the note always fits
    if len(outcome.message) <= MAX_TEXT_CHARS:
        outcome.message = outcome.message[: MAX_TEXT_CHARS - len(note)] + note
    return True


def mend_started(rs: pb.RunStarted, now: float, skew_s: float | None) -> bool:
    """Put, in place, a RunStarted's (or a Hello live run's) ``started_at_unix`` on the
    guard's clock: minus the agent's clock skew seen at its Hello (``skew_s``, agent minus
    guard) when that is beyond :data:`~guard.server.control._clocks.SKEW_NOTABLE_S`, then, if still
    outside :func:`timestamp_ok`'s bounds, the receive time ``now``. An agent clock a day
    ahead or years behind so neither gets its run refused nor its deadline eaten (a
    re-registered run's deadline resumes from its start time). True when it changed."""
    started = rs.started_at_unix
    if started == 0.0:
        return False
    mended = started
    if skew_s is not None and abs(skew_s) > SKEW_NOTABLE_S and math.isfinite(started):
        mended = started - skew_s
    if not timestamp_ok(mended, now):
        mended = now
    if mended == started:
        return False
    rs.started_at_unix = mended
    return True


def end_record(
    registry: Any, session: AgentSession, outcome: pb.Outcome, principal: Principal
) -> None:
    """One RunEnded's outcome: clocks mended (:func:`mend_clock`), then the registry's
    ``ended_by_agent``; a record out of bounds is refused on its own (``Reject``, dead
    letter) and the stream goes on. An authorisation failure still ends the stream: that is
    a misbehaving caller, not a bad record."""
    if mend_clock(outcome, time.time()):
        registry.stats["records_clamped"] = registry.stats.get("records_clamped", 0) + 1
    try:
        record = outcome_from_pb(outcome)
    except InvalidInput as exc:  # InputTooLarge too: bounds, never authorisation
        _refuse(registry, session, outcome, exc, principal)
        return
    registry.ended_by_agent(session, record, principal)


def _refuse(
    registry: Any,
    session: AgentSession,
    outcome: pb.Outcome,
    exc: InvalidInput,
    principal: Principal,
) -> None:
    run_id = outcome.run_id[:MAX_ID_CHARS]
    reason = " ".join(str(exc).split())[:MAX_REASON_CHARS]
    code = status_for(exc)
    registry.stats["records_rejected"] = registry.stats.get("records_rejected", 0) + 1
    kept = _dead_letter(registry.sink, outcome, run_id, f"{code.name}: {reason}")
    _end_live_run(registry, session, run_id, reason, principal)
    _post_reject(session, "run_ended", run_id, reason, code, dead_lettered=kept)


def refuse_message(
    registry: Any,
    session: AgentSession,
    body: str,
    exc: InvalidInput,
    *,
    run_id: str = "",
    request_id: int = 0,
    size: int = 0,
) -> None:
    """Answer one refused AgentMessage (not a RunEnded: :func:`end_record` refuses those)
    with a ``Reject`` naming its kind, its run and request when it has them, the reason
    and the status code; the caller applies nothing of it and the stream goes on. Counted
    (``messages_rejected`` and ``control_rejected_<body>``); the session's first refusal is logged
    at WARNING, the rest are counted only (a broken agent may send thousands). ``size``:
    the refused message's bytes when known, for :func:`~guard.server.runtime._memtrim.after_refusal`
    (memory a large refused message took goes back to the system)."""
    body = body or "unknown"
    reason = " ".join(str(exc).split())[:MAX_REASON_CHARS]
    code = status_for(exc)
    stats = registry.stats
    stats["messages_rejected"] = stats.get("messages_rejected", 0) + 1
    key = f"control_rejected_{body}"
    stats[key] = stats.get(key, 0) + 1
    run_id = run_id[:MAX_ID_CHARS]
    refused = session.messages_rejected + 1
    session.messages_rejected = refused
    if refused == 1:
        log.warning(
            "guard: refused a %s from agent process %.80r (run %.80r): %s: %s (the stream "
            "goes on; further refusals on this stream are counted, not logged)",
            body,
            session.process_id,
            run_id,
            code.name,
            reason,
        )
    _post_reject(session, body, run_id, reason, code, request_id=request_id)
    if size:
        after_refusal(size)


def _post_reject(
    session: AgentSession,
    body: str,
    run_id: str,
    reason: str,
    code: Any,
    *,
    dead_lettered: bool = False,
    request_id: int = 0,
) -> None:
    msg, reject = session.compose("reject")
    reject.run_id, reject.body, reject.reason = run_id, body, reason
    reject.code, reject.dead_lettered = code.value[0], dead_lettered
    if request_id:
        reject.request_id = request_id
    session.post(msg)


def _dead_letter(sink: Any, outcome: pb.Outcome, run_id: str, error: str) -> bool:
    """The refused record into the sink's dead letter, when it has one; else one WARNING
    line (the count is in the guard's stats either way). True when dead-lettered."""
    dead_letter = getattr(sink, "dead_letter", None)
    if callable(dead_letter):
        raw = text_format.MessageToString(outcome, as_one_line=True)[:_MAX_RAW_CHARS]
        try:
            dead_letter("runs", run_id, error, raw)
            return True
        except Exception:  # the sink's contract is not to raise; never lose the refusal
            log.exception("guard: dead-lettering the record of run %.80r failed", run_id)
    log.warning("guard: refused the RunEnded of run %.80r (%s)", run_id, error)
    return False


def _end_live_run(
    registry: Any, session: AgentSession, run_id: str, reason: str, principal: Principal
) -> None:
    """The agent has ended the run, but its record was refused: the guard ends it with its
    own counters (one record, decided_by guard), so it gives back its tenant's slot now
    rather than at agent_lost, after the stream drops. Only this stream's run of the
    caller's tenant: a refused record never touches another tenant's run."""
    run = registry.runs.get(run_id)
    if run is None or run.session is not session:
        return
    if principal.tenant is not None and run.tenant != principal.tenant:
        return
    message = f"the agent's termination record was refused: {reason}"[:MAX_TEXT_CHARS]
    registry.end_run(run, Status.FAILED, Reason.ERROR, message, DecidedBy.GUARD)
