"""The native fingerprint fast paths (guard/policy/_speedups.c) equal the Python reference.

The native module handles the usual tool arguments (a dict of printable-ASCII strings, ints,
bools and None) and results; everything else must come back as ``None`` so the reference
handles it. Either way the fingerprint must be byte-identical to the pure-Python one: the
hypothesis strategies below aim at the edges of the fast case (case, outer and double spaces,
quotes and backslashes, punctuation, numbers and dates, the 64-char and 8-token limits of
short text, ignored and colliding keys, big ints).
"""

from __future__ import annotations

import hashlib
import os
import types

import pytest
from _hyp import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guard.policy import Fingerprinter
from guard.policy import _fingerprint as F

if not F.native_available():
    if os.environ.get("CI"):  # CI machines have a C compiler: a missing build is a defect
        pytest.fail("guard.policy._speedups was not built", pytrace=False)
    pytest.skip("native fast paths not built (no C compiler)", allow_module_level=True)

from guard.policy import _speedups as N

KEY = b"native-key-0123456789"
IGNORE = ("page", "Offset ", "ｃｕｒｓｏｒ")  # a full-width entry normalises to ASCII "cursor"


def _pair(**kw: object) -> tuple[Fingerprinter, Fingerprinter]:
    saved = F._NATIVE
    F._NATIVE = None
    try:
        python = Fingerprinter(KEY, **kw)  # type: ignore[arg-type]
    finally:
        F._NATIVE = saved
    return python, Fingerprinter(KEY, **kw)  # type: ignore[arg-type]


PY, NATIVE = _pair(ignore_fields=IGNORE)
assert PY._native is None and NATIVE._native is not None

_EDGE_TEXT = st.text(
    alphabet=st.sampled_from([*'aAzZ09 "\\-.,:/_+', "\t", "é", "杭"]), min_size=0, max_size=80
)
_WORDS = st.lists(
    st.text(alphabet="abcXYZ0189", min_size=1, max_size=9), min_size=1, max_size=10
).map(" ".join)
_STRINGS = st.one_of(
    _EDGE_TEXT,
    _WORDS,
    _WORDS.map(lambda w: f"  {w.upper()} "),
    st.from_regex(r"[+-]?\d{1,4}(\.\d*)?", fullmatch=True),
    st.sampled_from(["2026-11-30", "nan", "Inf", "", " ", "a" * 65, "a " * 8 + "b", "a " * 7]),
)
_SCALARS = st.one_of(
    _STRINGS,
    st.integers(min_value=-(2**70), max_value=2**70),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False),
)
_KEYS = st.one_of(_EDGE_TEXT.map(lambda s: s[:10]), st.sampled_from(["page", "PAGE", " page", "q"]))
_ARGS = st.dictionaries(_KEYS, st.one_of(_SCALARS, st.lists(_SCALARS, max_size=2)), max_size=6)


@settings(max_examples=examples(1500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=st.one_of(_ARGS, _SCALARS))
def test_action_fingerprints_are_identical(args: object) -> None:
    assert NATIVE.action("search", args) == PY.action("search", args)


@settings(max_examples=examples(800), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=st.one_of(_SCALARS, _ARGS))
def test_result_hashes_are_identical(value: object) -> None:
    assert NATIVE.result(value) == PY.result(value)


@settings(max_examples=examples(200), deadline=None)
@given(facts=st.lists(_STRINGS, max_size=4), text=_EDGE_TEXT)
def test_state_and_text_hashes_are_identical(facts: list[str], text: str) -> None:
    assert NATIVE.state(facts) == PY.state(facts)
    assert NATIVE.text(text) == PY.text(text)


def test_usual_arguments_take_the_native_path() -> None:
    """The fast case really is native (a None here would silently keep the slow path)."""
    inner = NATIVE._tools.get("search") or NATIVE._state(b"search\x00", NATIVE._inner[b"action"])
    usual = [
        {"q": "refund 12345", "lang": "en"},
        {"Path": "src/a.py", "n": 3, "dry_run": False, "page": 2, "x": None},
        {"query": "Why does the build FAIL on arm64", "k": -7},
        {},
    ]
    for args in usual:
        assert N.action(inner, NATIVE._outer, args, NATIVE._ignore_ascii) is not None, args
    for value in (5, -1, None, True, "no results", "Done 3 files changed"):
        assert N.result(NATIVE._inner[b"result"], NATIVE._outer, value) is not None, value


@pytest.mark.parametrize(
    "args",
    [
        {"q": 1.5},  # floats: _number()
        {"q": "007"},  # numeric strings
        {"when": "2026-11-30"},  # dates
        {"q": "杭州 天气"},  # non-ASCII
        {"q": "a, b"},  # punctuation in short text: the token regex
        {"q": "a\tb"},  # whitespace other than a single space
        {"q": "a  b"},  # a double space
        {"Q": "x", "q ": "y"},  # keys that collide once normalised
        {"q": ["a"]},  # nesting
        {"q": {"a": 1}},
        {1: "a"},  # a non-str key
        {"q": 2**64},  # beyond 64 bits
        [1, 2],  # not a dict
        {f"k{i}": i for i in range(40)},  # more keys than the native path takes
    ],
)
def test_other_arguments_fall_back_to_the_reference(args: object) -> None:
    inner = NATIVE._state(b"t\x00", NATIVE._inner[b"action"])
    assert N.action(inner, NATIVE._outer, args, NATIVE._ignore_ascii) is None
    assert NATIVE.action("t", args) == PY.action("t", args)


@settings(max_examples=examples(200), deadline=None)
@given(data=st.binary(max_size=300))
def test_sha256_is_sha256(data: bytes) -> None:
    assert N.sha256(data) == hashlib.sha256(data).digest()


def test_bad_states_are_a_clear_type_error() -> None:
    with pytest.raises(TypeError, match="state"):
        N.mac(b"short", NATIVE._outer, "x")
    with pytest.raises(TypeError):
        N.action(NATIVE._outer, NATIVE._outer, {})  # wrong arity


# -- the loop detector's window --------------------------------------------------------------
_IDS = st.sampled_from(
    [
        "7ce842609ec9c94124d9c36704e8ec53",
        "7CE842609EC9C94124D9C36704E8EC53",  # the same 64 bits, upper case
        "7ce842609ec9c941ffffffffffffffff",  # the same first 64 bits, another tail
        "08b7237b66c709280f8dfd16f78482d0",
        "0000000000000000aaaa",  # parses to 0, stored as 1
        "abc",  # short: the reference parses it
        "-1",  # a sign: hashed, never a negative ring slot
        " ff",
        "not-a-fingerprint",
        "",
    ]
)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    calls=st.lists(st.tuples(_IDS, st.one_of(st.none(), _IDS)), max_size=40),
    window=st.integers(2, 8),
    k=st.integers(2, 5),
)
def test_native_window_gives_the_reference_verdicts(
    calls: list[tuple[str, str | None]], window: int, k: int
) -> None:
    from guard.policy import LoopDetector, LoopSettings

    s = LoopSettings(window=window, repeat_threshold=k)
    native, ref = LoopDetector(s), LoopDetector(s)
    ref._native = None
    for action, result in calls:
        assert native.observe_action(action, result) == ref.observe_action(action, result)
        assert native._acts == ref._acts and native._res == ref._res
    assert native.hits == ref.hits


_STEP_END = st.tuples(
    st.sampled_from(["facts 1", "facts 2", "facts 3", None]),
    st.sampled_from([None, None, True, False]),
    st.booleans(),
)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    events=st.lists(st.one_of(st.tuples(_IDS, st.one_of(st.none(), _IDS)), _STEP_END), max_size=60),
    window=st.integers(2, 8),
    k=st.integers(2, 5),
)
def test_native_window_gives_the_reference_verdicts_across_steps(
    events: list[tuple], window: int, k: int
) -> None:
    """The same with step ends in between (state, progress): growing facts separate repeats."""
    from guard.policy import LoopDetector, LoopSettings

    s = LoopSettings(window=window, repeat_threshold=k, no_progress_steps=3)
    native, ref = LoopDetector(s), LoopDetector(s)
    ref._native = None
    for e in events:
        if len(e) == 2:
            assert native.observe_action(*e) == ref.observe_action(*e)
        else:
            kw = {"state": e[0], "progress": e[1], "acted": e[2]}
            assert native.end_step(**kw) == ref.end_step(**kw)
        assert native._acts == ref._acts and native._res == ref._res
        assert native._gbits == ref._gbits
    assert native.hits == ref.hits


def test_observe_refuses_mismatched_rings() -> None:
    from array import array

    with pytest.raises(ValueError, match="slot"):
        N.observe(array("Q", [0] * 4), array("Q", [0] * 4), 4, "a" * 32, None, 2, 4)
    with pytest.raises(ValueError, match="unequal"):
        N.observe(array("Q", [0] * 4), array("Q", [0] * 3), 0, "a" * 32, None, 2, 4)


def test_the_built_module_has_every_function_its_protocol_declares() -> None:
    # Native is the one declaration of the module's types (there is no stub): a function
    # renamed or dropped in the C must fail here, not at its first call.
    assert isinstance(N, F.Native)
    assert not isinstance(types.SimpleNamespace(state=N.state, mac=N.mac), F.Native)
