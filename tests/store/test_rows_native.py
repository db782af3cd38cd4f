"""The native WAL line (``_rowsnative.line``) against its reference (``_rows._py_line``).

Byte for byte, on generated field tuples that mostly sit on the fast path (every field of
its exact type and range) and often step just off it (a str subclass, a bool for an int, a
counter one past its top, a NaN, a timestamp below 1 or past 2299): there the native side
must answer ``None`` exactly when the reference does.
"""

from __future__ import annotations

import json
import math
import sys

import pytest
from _hyp import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from guard.policy._types import DecidedBy, Reason, Status
from guard.store import _rows

from .conftest import outcome

_NATIVE = pytest.importorskip("guard.store._rowsnative")

_TOP32 = 2**32 - 1
_TOP64 = 2**64 - 1
_MAX_TS = 10_413_791_999.999


class _Str(str):
    """A str subclass: not a plain string, so both sides must refuse it."""


_chars = st.one_of(
    st.characters(),  # any code point but surrogates: non-ASCII, astral (surrogate pairs)
    st.characters(max_codepoint=0x7F),  # ASCII, with every control and escape
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),  # lone surrogates
    st.sampled_from('"\\\b\f\n\r\t\x00\x1f\x7f\u2028\ufeff\U0001f600'),
)
_plain = st.text(_chars, max_size=24)
_enums = st.sampled_from(list(Status) + list(Reason) + list(DecidedBy))
_ts_on = st.one_of(
    st.floats(min_value=1.0, max_value=_MAX_TS),
    st.sampled_from([1.0, _MAX_TS, 1_796_051_185.4425, 1_796_051_185.0005, 2.0004999]),
)
_cost_on = st.one_of(
    st.none(),
    st.floats(allow_nan=False, allow_infinity=False),  # repr of any finite double
    st.sampled_from([0.0, -0.0, 5e-324, 1e16, 1e-7, sys.float_info.max, 0.1 + 0.2]),
)


def _ints_on(top: int) -> st.SearchStrategy[int]:
    return st.one_of(
        st.integers(min_value=0, max_value=top), st.sampled_from([0, 1, top, 2**31, 10**9])
    )


def _ints_off(top: int) -> st.SearchStrategy[object]:
    return st.one_of(
        st.sampled_from([top + 1, -1, 2**64, -(2**63), 10**30, True, False, 1.0, None, "1"]),
        st.integers(min_value=-(2**70), max_value=-1),
        st.integers(min_value=top + 1, max_value=2**70),
    )


_STR = (_plain, st.one_of(_plain.map(_Str), st.sampled_from([None, 1, b"x"])))
_OPT = (st.one_of(st.none(), st.just(""), _plain), st.one_of(_plain.map(_Str), st.just(0)))
_NAME = (st.one_of(_plain, _enums), st.one_of(_plain.map(_Str), st.sampled_from([None, 2])))
_TS = (
    _ts_on,
    st.one_of(
        st.sampled_from([0.9999999, math.nextafter(_MAX_TS, math.inf), 0.0, -1.0]),
        st.sampled_from([math.nan, math.inf, -math.inf, 1e300, None, "1.5"]),
        st.integers(min_value=1, max_value=2_000_000_000),
    ),
)
_U32 = (_ints_on(_TOP32), _ints_off(_TOP32))
_U64 = (_ints_on(_TOP64), _ints_off(_TOP64))
_DL = (st.one_of(st.none(), _ints_on(_TOP64)), _ints_off(_TOP64).filter(lambda v: v is not None))
_COST = (_cost_on, st.sampled_from([math.nan, math.inf, -math.inf, 0, 1, True, "0.5"]))
_BOOL = (st.booleans(), st.sampled_from([0, 1, None, "true"]))

# (on the fast path, just off it) for each field, in RUN_COLUMNS order
_SPEC = (
    _STR, _OPT, _STR, _STR, _NAME, _NAME, _STR,  # run_id .. message
    _TS, _TS, _U64, _DL,  # started, ended, elapsed, deadline
    _U32, _U32, _U32, _U32, _U64, _U64, _U64, _U64,  # steps .. tool_attempts, tokens
    _COST, _OPT, _OPT, _U32, _BOOL, _BOOL, _STR, _NAME, _STR,  # cost .. trace_id
)  # fmt: skip


@st.composite
def _fields(draw: st.DrawFn) -> tuple[object, ...]:
    """Every field on the fast path, then (half the time) one or two stepped off it."""
    fields = [draw(on) for on, _ in _SPEC]
    for i in draw(st.lists(st.integers(0, len(_SPEC) - 1), max_size=2)):
        fields[i] = draw(_SPEC[i][1])
    return tuple(fields)


@settings(max_examples=examples(1000, full=4000), deadline=None)
@given(_fields())
def test_native_line_is_the_reference_byte_for_byte(fields: tuple[object, ...]) -> None:
    expected = _rows._py_line(fields)
    got = _NATIVE.line(fields)
    assert got == expected
    if got is not None:
        assert type(got) is str and got.isascii() and "\n" not in got
        assert isinstance(json.loads(got), list)


def test_the_realistic_record_takes_the_native_path() -> None:
    for i in range(500):
        fields = _rows._RUN_FIELDS(outcome(i, now=1_796_000_000.123))
        line = _NATIVE.line(fields)
        assert line is not None and line == _rows._py_line(fields)


def test_native_refuses_what_is_not_the_fields_tuple() -> None:
    fields = _rows._RUN_FIELDS(outcome(1))
    for bad in (list(fields), fields[:-1], (*fields, None)):
        with pytest.raises(TypeError):
            _NATIVE.line(bad)


def test_use_native_switches_run_line_and_both_agree() -> None:
    o = outcome(3, message='quote " back\\slash \n ünï \U0001f600 \ud800')
    before = _rows.use_native(False)
    try:
        assert _rows._line is _rows._py_line
        reference = _rows.run_line(o)
        assert _rows.use_native(True) is False
        assert _rows._line is _NATIVE.line
        assert _rows.run_line(o) == reference
    finally:
        _rows.use_native(before)


def test_off_path_records_still_take_the_sanitising_reference() -> None:
    o = outcome(1, run_id="r", steps=-4)
    assert _NATIVE.line(_rows._RUN_FIELDS(o)) is None
    line, run_id = _rows.run_line(o)
    assert run_id == "r" and json.loads(line)[_rows.RUN_COLUMNS.index("steps")] == 0
