"""The fast paths of canonicalisation and fingerprinting change no fingerprint.

Fingerprints are stored (ClickHouse, the guard's loop windows), so they must stay the same
for the same key and input across versions: golden values computed by the previous
implementation, and property tests against reference copies of the code paths that were
given fast paths (string canonicalisation, JSON encoding, HMAC). The decision's fast paths
are held to decide() in test_policy_escalation.py.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import unicodedata

import pytest
from _hyp import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guard.policy import Fingerprinter, LoopSettings
from guard.policy import _canonical as C
from guard.policy import _fingerprint as F

KEY = b"golden-key-0123456789"

# Computed with the implementation before the fast paths (commit 0f40059).
GOLDEN_ACTIONS = [
    (("search", {"q": "refund 12345", "lang": "en"}), "7ce842609ec9c94124d9c36704e8ec53"),
    (
        ("search", {"Q ": "  Refund   12345 ", "LANG": "EN", "page": 3}),
        "7ce842609ec9c94124d9c36704e8ec53",
    ),
    (("search", {"q": "杭州 天气"}), "08b7237b66c709280f8dfd16f78482d0"),
    (("read_file", {"path": "src/a.py", "n": 1.0}), "b84147a0bd61ee14d6a4ed0174c519e3"),
    (
        ("t", {"when": "2026-11-30T10:00:00Z", "x": "007", "y": [1, "2", None, True]}),
        "dce880c9e5c9835ebc61f62c4592f1c8",
    ),
    (
        (
            "t",
            {"s": "Ｆｕｌｌ　ｗｉｄｔｈ", "tab": "a\tb", "e": "", "neg": "-1.50", "nan": math.nan},
        ),
        "948f5f004860dd9afc6cac3d41a0dbb3",
    ),
    (("t", ["b a", "x_y z", "+5 apples", "0:", "a.b c"]), "f4d5185d1225a6680a4b6eb5ab21e04b"),
]
GOLDEN_RESULTS = [
    (5, "ea59ddfa85e78f84fa5029a4fcf2733c"),
    ("no results", "cb79da45d086dbf0a9883eeed7c239c3"),
    ({"rows": [], "total": 0}, "a7905707fbbf5d16cc87adc719ee4051"),
    (None, "4235ac55df262456bdeba28489296da4"),
    (3.25, "2ff8caf0e1e791bfa76aff175fbbfd17"),
]


# Both implementations must produce these: the pure-Python reference and, when built, the
# native fast paths (guard/policy/_speedups.c).
IMPLS = ["python", "native"] if F.native_available() else ["python"]


def make_fingerprinter(impl: str, key: bytes | str, **kw: object) -> Fingerprinter:
    """A Fingerprinter on the given implementation (chosen once, at construction)."""
    saved = F._NATIVE
    F._NATIVE = saved if impl == "native" else None
    try:
        return Fingerprinter(key, **kw)  # type: ignore[arg-type]
    finally:
        F._NATIVE = saved


@pytest.mark.parametrize("impl", IMPLS)
def test_fingerprints_are_the_stored_ones(impl: str) -> None:
    fp = make_fingerprinter(impl, KEY)
    for (tool, args), want in GOLDEN_ACTIONS:
        assert fp.action(tool, args) == want, (tool, args)
    for value, want in GOLDEN_RESULTS:
        assert fp.result(value) == want, value
    assert fp.state(["b", "a"]) == "42d97786fa46a0c0febca3710637aabe"
    assert fp.text("Hello  World") == "28b5a2651a77fcf24c422f5d704f9229"


@settings(max_examples=examples(200), deadline=None)
@given(
    key=st.one_of(st.binary(min_size=1, max_size=200), st.text(min_size=1, max_size=80)),
    payload=st.text(max_size=300),
)
def test_precomputed_hmac_is_hmac_sha256(key: bytes | str, payload: str) -> None:
    raw = key.encode() if isinstance(key, str) else key
    for impl in IMPLS:
        fp = make_fingerprinter(impl, key)
        for domain in (b"action", b"result", b"state", b"text"):
            want = hmac.new(raw, domain + b"\x00" + payload.encode(), hashlib.sha256).hexdigest()
            assert fp._mac(domain, payload) == want[:32], impl


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    args=st.one_of(
        st.dictionaries(
            st.one_of(st.text(max_size=8), st.integers()),
            st.one_of(st.text(max_size=40), st.integers(), st.none(), st.lists(st.text())),
            max_size=5,
        ),
        st.text(max_size=300),
        st.integers(),
        st.lists(st.text(max_size=10), max_size=3),
    )
)
def test_action_and_result_fast_paths_are_hmac_of_canonicalize(args: object) -> None:
    """The inline dict / string / int branches of action() and result() hash exactly what
    canonicalize() produces, in both implementations."""
    for impl in IMPLS:
        fp = make_fingerprinter(impl, KEY, ignore_fields=("page",))
        assert fp.action("t", args) == fp._mac(
            b"action", "t\x00" + C.canonicalize(args, ignore_fields=("page",))
        ), impl
        assert fp.result(args) == fp._mac(b"result", C.canonicalize(args)), impl


# -- reference copies of the string canonicalisation before its fast paths ----------------
_REF_WS = re.compile(r"\s+")


def _ref_norm(s: str) -> str:
    if not s.isascii():
        s = unicodedata.normalize("NFKC", s)
    return _REF_WS.sub(" ", s).strip().casefold()


def _ref_string(s: str) -> object:
    s = _ref_norm(s)
    if C._NUM.fullmatch(s):
        return C._numeric(s)
    if s in C._SPECIAL:
        return C._SPECIAL[s]
    if s[:4].isdigit():
        d = C._date(s)
        if d is not None:
            return d
    if (
        len(s) <= C.SHORT_MAX_CHARS
        and s.count(" ") < C.SHORT_MAX_TOKENS
        and (" " in s or C._HAS_CJK.search(s) is not None)
    ):
        tokens = C._TOKEN.findall(s)
        if tokens:
            joined = " ".join(sorted(tokens))
            return C._numeric(joined) if C._NUM.fullmatch(joined) else joined
    return s


_ASCIIISH = st.text(
    alphabet=st.sampled_from([*list("abcXYZ019 _-+.:/\t\n\x1f\x7f"), "é", "杭", "州", "١", "²"]),
    max_size=40,
)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(s=st.one_of(_ASCIIISH, st.text(max_size=70), st.from_regex(r"[+-]?\d{1,5}(\.\d*)?")))
def test_string_fast_paths_match_the_reference(s: str) -> None:
    got, want = C._string_cached.__wrapped__(s), _ref_string(s)
    assert type(got) is type(want) and (got == want or (got != got and want != want)), s
    assert C._norm(s) == _ref_norm(s)


_JSONISH = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=20),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=examples(300), deadline=None)
@given(value=_JSONISH)
def test_prebuilt_json_encoder_matches_json_encoder(value: object) -> None:
    ref = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode
    canon = C._canon(value, frozenset())
    assert C._dump(canon) == ref(canon)


def test_loop_settings_default_is_unchanged() -> None:
    assert LoopSettings() == LoopSettings(window=20, repeat_threshold=3, no_progress_steps=8)
