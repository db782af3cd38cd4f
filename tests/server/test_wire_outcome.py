"""``outcome_from_pb`` (one pass over the fields, the checks only when a bound fails) gives
exactly what the field-by-field reference gave: the same record for every valid Outcome, the
same error type and words for every invalid one."""

from __future__ import annotations

import contextlib
import math

import pytest
from _hyp import examples
from hypothesis import example, given, settings
from hypothesis import strategies as st

from guard._wire_outcome import _OUTCOME_IDS, _enum  # the slow path's, unchanged
from guard.bounds import (
    MAX_COST_USD_PER_RECORD,
    MAX_COUNTER,
    MAX_ID_CHARS,
    MAX_TEXT_CHARS,
    check_count,
    check_id,
    check_text,
    check_unix,
)
from guard.errors import InvalidInput
from guard.policy import USAGE_COUNTERS, DecidedBy, Outcome, Reason, Status
from guard.v1 import guard_pb2 as pb
from guard.wire import outcome_from_pb, usage_from_pb

# The conversions bound timestamps by "now + 1 day". Both sides read one frozen instant, so a
# value near that bound cannot fall between their two clock readings, and the strategies built
# from it draw the same values on any day (a replayed failure is the same case).
NOW = 1_800_000_000.0


class _FrozenTime:
    @staticmethod
    def time() -> float:
        return NOW


@contextlib.contextmanager
def _frozen_clock():
    import guard._wire_outcome as fast
    import guard.bounds as bounds

    saved = fast.time, bounds.time
    fast.time = bounds.time = _FrozenTime
    try:
        yield
    finally:
        fast.time, bounds.time = saved


def reference_outcome_from_pb(msg: pb.Outcome) -> Outcome:
    """The conversion as it was before the one-pass version (the reference)."""
    check_id("outcome.run_id", msg.run_id, required=True)
    for name in _OUTCOME_IDS:
        check_id(f"outcome.{name}", getattr(msg, name))
    check_text("outcome.message", msg.message)
    usage = usage_from_pb(msg.usage)
    started = check_unix("outcome.started_at_unix", msg.started_at_unix)
    ended = check_unix("outcome.ended_at_unix", msg.ended_at_unix)
    check_count("outcome.elapsed_ms", msg.elapsed_ms)
    if msg.HasField("deadline_ms"):
        check_count("outcome.deadline_ms", msg.deadline_ms)
    return Outcome(
        run_id=msg.run_id,
        status=_enum(Status, "status", msg.status),
        reason=_enum(Reason, "reason", msg.reason),
        message=msg.message,
        parent_run_id=msg.parent_run_id or None,
        tenant=msg.tenant,
        agent=msg.agent,
        trace_id=msg.trace_id,
        steps=usage.steps,
        model_calls=usage.model_calls,
        tool_calls=usage.tool_calls,
        tool_attempts=usage.tool_attempts,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        reasoning_tokens=usage.reasoning_tokens,
        cached_tokens=usage.cached_tokens,
        cost_usd=usage.cost_usd,
        elapsed_ms=int(msg.elapsed_ms),
        deadline_ms=int(msg.deadline_ms) if msg.HasField("deadline_ms") else None,
        last_tool=msg.last_tool or None,
        last_action_hash=msg.last_action_hash or None,
        loop_hits=int(msg.loop_hits),
        partial_result=msg.partial_result,
        recoverable=msg.recoverable,
        decided_by=_enum(DecidedBy, "decided_by", msg.decided_by, DecidedBy.SDK),
        price_book_version=msg.price_book_version,
        started_at=started,
        ended_at=ended,
    )


_CANONICAL = pb.Outcome(
    run_id="r1",
    tenant="acme",
    agent="a",
    status="completed",
    reason="final_answer",
    message="done",
    usage=pb.Usage(steps=3, model_calls=3, input_tokens=1200, output_tokens=90, cost_usd=0.25),
    decided_by="sdk",
    started_at_unix=1.7e9,
    ended_at_unix=1.7e9 + 3,
)


def _odd_text(limit: int):
    return st.one_of(
        st.text(max_size=12),
        st.sampled_from(["", "x" * limit, "y" * (limit + 1), "é" * limit, "é" * (limit + 1)]),
    )


_U64 = st.one_of(
    st.integers(0, 1000),
    st.sampled_from([MAX_COUNTER, MAX_COUNTER + 1, 2**64 - 1]),
    st.integers(0, 2**64 - 1),
)
_COST = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-9, MAX_COST_USD_PER_RECORD, math.nextafter(1e9, 2e9), -1.0]),
)
_UNIX = st.one_of(
    st.sampled_from([0.0, -0.0, 946_684_800.0, 946_684_799.9, 4e9, math.nan, math.inf]),
    st.floats(9e8, NOW + 2 * 86_400.0),
    st.floats(allow_nan=True, allow_infinity=True),
)
_IDS_ODD = {name: _odd_text(MAX_ID_CHARS) for name in ("run_id", *_OUTCOME_IDS)}
_ODD = {
    **_IDS_ODD,
    "status": st.one_of(st.sampled_from([m.value for m in Status]), _IDS_ODD["status"]),
    "reason": st.one_of(st.sampled_from([m.value for m in Reason]), _IDS_ODD["reason"]),
    "decided_by": st.one_of(st.sampled_from([m.value for m in DecidedBy]), _IDS_ODD["decided_by"]),
    "message": _odd_text(MAX_TEXT_CHARS),
    "elapsed_ms": _U64,
    "deadline_ms": _U64,
    "loop_hits": st.integers(0, 2**32 - 1),
    "partial_result": st.booleans(),
    "recoverable": st.booleans(),
    "started_at_unix": _UNIX,
    "ended_at_unix": _UNIX,
    "usage.cost_usd": _COST,
    **{f"usage.{n}": _U64 for n in ("steps", "model_calls", "input_tokens", "cached_tokens")},
}


@st.composite
def outcomes(draw) -> pb.Outcome:
    """A valid Outcome with a few fields (none, one, several) set to odd or out-of-bounds
    values: every bound gets tested alone and together with others."""
    msg = pb.Outcome()
    msg.CopyFrom(_CANONICAL)
    if draw(st.booleans()):
        msg.usage.ClearField("cost_usd")
    for name in draw(st.lists(st.sampled_from(sorted(_ODD)), max_size=4)):
        value = draw(_ODD[name])
        target, field = (msg.usage, name[6:]) if name.startswith("usage.") else (msg, name)
        setattr(target, field, value)
    return msg


def _answer(convert, msg):
    try:
        with _frozen_clock():
            return ("ok", convert(msg))
    except InvalidInput as exc:  # InputTooLarge is one of these
        return (type(exc).__name__, str(exc))


def _same(a, b) -> bool:
    if a[0] != "ok" or b[0] != "ok":
        return a == b
    # NaN never reaches a record (it is refused), so == on the records is exact
    return a[1] == b[1] and [type(getattr(a[1], f)) for f in Outcome.__slots__] == [
        type(getattr(b[1], f)) for f in Outcome.__slots__
    ]


@settings(max_examples=examples(300), deadline=None)
@given(outcomes())
@example(_CANONICAL)
@example(pb.Outcome())
@example(pb.Outcome(run_id="r", status="completed", reason="bored"))
@example(pb.Outcome(run_id="r", status="s" * 300, reason="final_answer"))
@example(pb.Outcome(run_id="r", status="completed", reason="final_answer", decided_by="me"))
def test_outcome_from_pb_equals_the_reference(msg):
    fast, ref = _answer(outcome_from_pb, msg), _answer(reference_outcome_from_pb, msg)
    assert _same(fast, ref), (fast, ref)


_EDGES = {
    **{
        name: ["", "x" * MAX_ID_CHARS, "y" * (MAX_ID_CHARS + 1), "é" * (MAX_ID_CHARS + 1)]
        for name in ("run_id", *_OUTCOME_IDS)
    },
    "status": [m.value for m in Status] + ["Completed", "bored"],
    "reason": [m.value for m in Reason] + ["bored"],
    "decided_by": [m.value for m in DecidedBy] + ["SDK", "me"],
    "message": ["", "x" * MAX_TEXT_CHARS, "y" * (MAX_TEXT_CHARS + 1)],
    "elapsed_ms": [0, MAX_COUNTER, MAX_COUNTER + 1, 2**64 - 1],
    "deadline_ms": [0, MAX_COUNTER, MAX_COUNTER + 1],
    "started_at_unix": [0.0, -0.0, 946_684_800.0, 946_684_799.9, 4e9, -1.0, math.nan, -math.inf],
    "ended_at_unix": [0.0, 946_684_800.0, 946_684_799.9, NOW + 86_300.0, math.inf],
    "usage.cost_usd": [0.0, -0.0, MAX_COST_USD_PER_RECORD, 1e9 * (1 + 1e-15), -1e-300, math.nan],
    **{f"usage.{n}": [MAX_COUNTER, MAX_COUNTER + 1] for n in USAGE_COUNTERS},
}


def _cases(edges: dict) -> list:
    """(name, value) pairs with stable ids (a value may depend on the clock: the workers of
    a parallel run must collect the same names)."""
    return [
        pytest.param(n, v, id=f"{n}-{i}")
        for n, values in edges.items()
        for i, v in enumerate(values)
    ]


@pytest.mark.parametrize(("name", "value"), _cases(_EDGES))
def test_every_bound_at_its_edge_equals_the_reference(name, value):
    msg = pb.Outcome()
    msg.CopyFrom(_CANONICAL)
    target, field = (msg.usage, name[6:]) if name.startswith("usage.") else (msg, name)
    setattr(target, field, value)
    fast, ref = _answer(outcome_from_pb, msg), _answer(reference_outcome_from_pb, msg)
    assert _same(fast, ref), (fast, ref)


def test_a_canonical_outcome_is_converted_field_for_field():
    got = outcome_from_pb(_CANONICAL)
    assert got == reference_outcome_from_pb(_CANONICAL)
    assert got.status is Status.COMPLETED and got.decided_by is DecidedBy.SDK
    assert (got.steps, got.input_tokens, got.cost_usd, got.parent_run_id) == (3, 1200, 0.25, None)


def reference_check_run_started(rs: pb.RunStarted) -> None:
    """``check_run_started`` as it was (every check one by one), the reference."""
    from guard.wire import limits_from_pb

    check_id("run_started.run_id", rs.run_id, required=True)
    check_id("run_started.parent_run_id", rs.parent_run_id)
    check_id("run_started.tenant", rs.tenant)
    check_id("run_started.agent", rs.agent)
    trace = rs.trace_id
    if trace and (len(trace) != 32 or trace.strip("0123456789abcdefABCDEF")):
        raise InvalidInput(f"run_started.trace_id {trace[:40]!r} is not 32 hex characters")
    check_unix("run_started.started_at_unix", rs.started_at_unix)
    if rs.HasField("requested"):
        limits_from_pb(rs.requested)
    if rs.HasField("usage"):
        usage_from_pb(rs.usage)


_RS_EDGES = {
    **{
        name: ["", "x" * MAX_ID_CHARS, "y" * (MAX_ID_CHARS + 1)]
        for name in ("run_id", "parent_run_id", "tenant", "agent")
    },
    "trace_id": ["", "ab" * 16, "AB" * 16, "ab" * 15, "ab" * 17, "zz" * 16, " " * 32, "é" * 32],
    "started_at_unix": [0.0, -0.0, 946_684_800.0, 946_684_799.9, 4e9, math.nan, math.inf],
    "requested.max_steps": [0, 5, MAX_COUNTER + 1],
    "usage.input_tokens": [0, MAX_COUNTER, MAX_COUNTER + 1],
    "usage.cost_usd": [0.0, math.nan, -1.0],
}


@pytest.mark.parametrize(("name", "value"), _cases(_RS_EDGES))
def test_check_run_started_refuses_exactly_what_the_reference_refuses(name, value):
    from guard.wire import check_run_started

    rs = pb.RunStarted(run_id="r1", tenant="acme", agent="a", trace_id="0f" * 16)
    rs.started_at_unix = 1.7e9
    if "." in name:
        sub, field = name.split(".")
        setattr(getattr(rs, sub), field, value)
    else:
        setattr(rs, name, value)
    assert _answer(check_run_started, rs) == _answer(reference_check_run_started, rs)
