"""The WAL line fast path (``run_line``) against the reference (``encode_row(run_row(o))``)."""

from __future__ import annotations

import json
import math

import pytest
from _hyp import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from guard.policy._types import DecidedBy, Outcome, Reason, Status
from guard.store._dedup import RecentIds
from guard.store._rows import encode_row, run_line, run_row

from .conftest import outcome

NOW = 1_796_000_000.123

_text = st.text(max_size=12)  # any code point: escapes, surrogates, controls, non-ASCII
_ints = st.one_of(
    st.integers(min_value=-5, max_value=2**64 + 5),
    st.sampled_from([0, 1, 2**32 - 1, 2**32, 2**64 - 1, 2**64]),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.just("7"),
)
_floats = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-3, max_value=3),
    st.just("0.5"),
)
_times = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-1.0, max_value=1.2e10),
    st.floats(min_value=1.0, max_value=1e10),  # the realistic range, often
    st.sampled_from([0.0, 0.0004, 0.9995, 1.0, 1_796_051_185.4425, 10_413_791_999.999]),
    st.integers(min_value=0, max_value=2_000_000_000),
)
_names = st.one_of(_text, st.sampled_from(list(Status) + list(Reason) + list(DecidedBy)))
_optional = st.one_of(st.none(), st.just(""), _text)

_outcomes = st.builds(
    Outcome,
    run_id=_text,
    status=_names,
    reason=_names,
    message=_text,
    parent_run_id=_optional,
    tenant=_text,
    agent=_text,
    trace_id=_text,
    steps=_ints,
    model_calls=_ints,
    tool_calls=_ints,
    tool_attempts=_ints,
    input_tokens=_ints,
    output_tokens=_ints,
    reasoning_tokens=_ints,
    cached_tokens=_ints,
    cost_usd=_floats,
    elapsed_ms=_ints,
    deadline_ms=st.one_of(st.none(), _ints),
    last_tool=_optional,
    last_action_hash=_optional,
    loop_hits=_ints,
    partial_result=st.one_of(st.booleans(), st.just(0), st.just(1)),
    recoverable=st.booleans(),
    decided_by=_names,
    price_book_version=_text,
    started_at=_times,
    ended_at=_times,
)


def _reference(o: Outcome) -> tuple[str, str] | type[Exception]:
    try:
        row = run_row(o, NOW)
    except Exception as ex:
        return type(ex)
    return encode_row(row), row[0]


def _same_json(a: str, b: str) -> bool:
    """The same JSON values, floats compared exactly (NaN never occurs: allow_nan=False)."""
    return json.loads(a) == json.loads(b)


@settings(max_examples=examples(1000, full=3000), deadline=None)
@given(_outcomes)
def test_run_line_is_the_reference_row(o: Outcome) -> None:
    expected = _reference(o)
    if isinstance(expected, type):
        with pytest.raises(expected):
            run_line(o, NOW)
        return
    line, run_id = run_line(o, NOW)
    assert run_id == expected[1]
    assert _same_json(line, expected[0]), (line, expected[0])
    assert "\n" not in line and "\t" not in line  # one WAL line


def test_realistic_records_are_the_reference_row() -> None:
    for i in range(2000):
        o = outcome(i, now=NOW)
        line, run_id = run_line(o)
        assert run_id == o.run_id
        assert _same_json(line, encode_row(run_row(o)))
    ts = json.loads(run_line(outcome(1, started_at=1_796_051_185.4425, ended_at=NOW))[0])
    assert ts[7] == round(1_796_051_185.4425, 3) and ts[8] == round(NOW, 3)
    assert math.isclose(ts[8] - ts[7], NOW - 1_796_051_185.4425, abs_tol=1e-3)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.lists(st.integers(0, 60).map(str), max_size=15), max_size=30))
def test_recent_ids_remember_at_least_the_last_capacity(batches: list[list[str]]) -> None:
    capacity = 20
    recent = RecentIds(capacity)
    history: list[str] = []
    for batch in batches:
        ids = list(dict.fromkeys(batch))
        remembered = set(history[-capacity:])
        # no false "new": every id among the last `capacity` added is seen
        assert all(i in recent for i in remembered)
        if remembered & set(ids):
            assert not recent.isdisjoint(ids)
        known = {i for i in ids if i in recent}
        assert known <= set(history)  # and nothing never added is seen
        recent.add(ids)
        history.extend(ids)
