"""Canonicalisation of tool arguments and keyed fingerprints."""

from __future__ import annotations

import hashlib
import hmac
import math
import random

import pytest
from _hyp import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from guard.errors import InvalidInput
from guard.policy import Fingerprinter, canonicalize, hash64

SAME = [
    # key order
    ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
    ({"x": {"p": 1, "q": [1, 2]}}, {"x": {"q": [1, 2], "p": 1}}),
    # key case and whitespace
    ({"Query": "x"}, {" query ": "x"}),
    # value whitespace and case
    ({"q": "  Hello   World "}, {"q": "hello world"}),
    ({"q": "HELLO\tworld\n"}, {"q": "hello world"}),
    # token order of short strings
    ({"q": "天气 杭州"}, {"q": "杭州 天气"}),
    ({"q": "天气 杭州"}, {"q": "杭州天气"}),
    ({"q": "杭州天气"}, {"q": "天气杭州"}),
    ({"q": "weather hangzhou"}, {"q": "Hangzhou weather"}),
    ({"q": "hangzhou, weather"}, {"q": "weather hangzhou"}),
    ({"q": "杭州 weather"}, {"q": "weather 杭州"}),
    # numeric forms
    ({"id": 1}, {"id": 1.0}),
    ({"id": 1}, {"id": "1"}),
    ({"id": "1.0"}, {"id": " 1 "}),
    ({"price": 2.50}, {"price": "2.5"}),
    ({"n": 1e3}, {"n": "1000"}),
    # full-width forms (NFKC)
    ({"q": "ＡＢＣ１"}, {"q": "abc1"}),
    # dates in rotating formats
    ({"d": "2026-11-30"}, {"d": "2026/11/30"}),
    ({"d": "2026-11-30"}, {"d": "2026.11.30"}),
    ({"d": "2026-11-30"}, {"d": "2026-11-30T00:00:00Z"}),
    # tuples are lists, sets are ordered
    ({"ids": (1, 2)}, {"ids": [1, 2]}),
    ({"ids": {3, 1, 2}}, {"ids": {2, 3, 1}}),
]

DIFFERENT = [
    ({"a": 1}, {"a": 2}),
    ({"a": 1}, {"b": 1}),
    ({"ids": [1, 2]}, {"ids": [2, 1]}),  # list order is meaningful
    ({"flag": True}, {"flag": 1}),  # booleans are not numbers
    ({"v": None}, {"v": "none"}),
    ({"q": "杭州天气"}, {"q": "北京天气"}),
    ({"d": "2026-11-30"}, {"d": "2026-11-29"}),
    ({"q": "x" * 100 + " a b"}, {"q": "a b " + "x" * 100}),  # long strings keep order
    (
        {"q": "one two three four five six seven eight nine"},
        {"q": "nine eight seven six five four three two one"},
    ),  # > 8 tokens keep order
    ({"x": 1.5}, {"x": 1}),
    ({"path": "src/a.py"}, {"path": "a/src.py"}),  # identifiers and paths keep their order
    ({"url": "https://a.example/b"}, {"url": "https://b.example/a"}),
    ({"id": "ab-12"}, {"id": "12-ab"}),
]


@pytest.mark.parametrize(("a", "b"), SAME)
def test_equal_meaning_canonicalises_the_same(a, b) -> None:
    assert canonicalize(a) == canonicalize(b)


@pytest.mark.parametrize(("a", "b"), DIFFERENT)
def test_different_meaning_stays_different(a, b) -> None:
    assert canonicalize(a) != canonicalize(b)


@pytest.mark.parametrize(
    ("a", "b", "ignore"),
    [
        ({"q": "x", "page": 1}, {"q": "x", "page": 7}, ("page",)),
        ({"q": "x", "offset": 0}, {"q": "x"}, ("offset",)),
        ({"q": "x", "Cursor": "abc"}, {"q": "x", "cursor": "zzz"}, ("cursor",)),
        ({"f": {"q": "x", "page": 2}}, {"f": {"q": "x", "page": 3}}, ("page",)),  # nested
        ([{"page": 1, "q": 1}], [{"page": 9, "q": 1}], ("PAGE",)),
    ],
)
def test_ignore_fields(a, b, ignore) -> None:
    assert canonicalize(a, ignore_fields=ignore) == canonicalize(b, ignore_fields=ignore)
    assert canonicalize(a) != canonicalize(b)


def test_special_values() -> None:
    assert canonicalize(math.nan) == canonicalize(float("nan")) == '"nan"'
    assert canonicalize(math.inf) != canonicalize(-math.inf)
    assert canonicalize(b"\x00\x01") == '"bytes:0001"'
    assert canonicalize(None) == "null"
    assert canonicalize(10**30) == canonicalize(str(10**30)) == str(10**30)
    assert canonicalize("12345678901234567890123") != canonicalize("12345678901234567890124")
    assert canonicalize("007") == canonicalize(7)


def test_output_is_compact_sorted_json() -> None:
    assert canonicalize({"b": 1, "a": [True, None, "X"]}) == '{"a":[true,null,"x"],"b":1}'


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=5)
    ),
    max_leaves=20,
)


def _shuffled(value, rng: random.Random):
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


@settings(max_examples=examples(200), deadline=None)
@given(value=st.dictionaries(st.text(max_size=6), _json, max_size=8), seed=st.integers())
def test_fingerprint_ignores_key_order(value: dict, seed: int) -> None:
    fp = Fingerprinter(b"k")
    other = _shuffled(value, random.Random(seed))
    assert canonicalize(value) == canonicalize(other)
    assert fp.action("tool", value) == fp.action("tool", other)


@settings(max_examples=examples(100), deadline=None)
@given(value=_json)
def test_canonicalize_is_idempotent_on_its_json(value) -> None:
    import json

    once = canonicalize(value)
    assert canonicalize(json.loads(once)) == once


def test_fingerprints_are_keyed_hmac_sha256_truncated_to_128_bits() -> None:
    fp = Fingerprinter("secret")
    h = fp.action("search", {"q": "杭州天气"})
    assert len(h) == 32 and int(h, 16) >= 0
    payload = b"action\x00search\x00" + canonicalize({"q": "杭州天气"}).encode()
    assert h == hmac.new(b"secret", payload, hashlib.sha256).hexdigest()[:32]
    # an attacker without the key cannot reproduce it with plain SHA-256
    assert h != hashlib.sha256(payload).hexdigest()[:32]
    assert Fingerprinter("other").action("search", {"q": "杭州天气"}) != h
    assert Fingerprinter(b"secret").action("search", {"q": "杭州天气"}) == h


def test_random_key_per_process_instance() -> None:
    assert Fingerprinter().action("t", 1) != Fingerprinter().action("t", 1)


def test_domains_are_separated() -> None:
    fp = Fingerprinter(b"k")
    assert len({fp.action("x", "y"), fp.result("x"), fp.text("x"), fp.state(["x"])}) == 4


def test_action_tool_name_and_ignore_fields() -> None:
    fp = Fingerprinter(b"k", ignore_fields=("page",))
    assert fp.action("Search ", {"q": 1, "page": 1}) == fp.action("search", {"q": 1, "page": 2})
    assert fp.action("search", {"q": 1}) != fp.action("lookup", {"q": 1})
    assert Fingerprinter(b"k", ignore_fields=()).action("s", {"page": 1}) != Fingerprinter(
        b"k", ignore_fields=()
    ).action("s", {"page": 2})


def test_result_and_state_hashes() -> None:
    fp = Fingerprinter(b"k")
    assert fp.result({"rows": [], "n": 0}) == fp.result({"n": 0.0, "rows": []})
    assert fp.result([]) != fp.result([1])
    assert fp.state(["a", "b", "b"]) == fp.state(["b", "a"])  # order-insensitive, a set
    assert fp.state(["a"]) != fp.state(["a", "c"])
    assert fp.state([]) == fp.state(())


def test_text_keeps_word_order() -> None:
    fp = Fingerprinter(b"k")
    assert fp.text("Hello  World") == fp.text("hello world")
    assert fp.text("dog bites man") != fp.text("man bites dog")


def test_hash64() -> None:
    assert hash64(None) == 0
    assert hash64("") == 0
    assert hash64("00000000000000000000") == 1  # 0 is reserved for "unknown"
    assert hash64("ffffffffffffffff0000") == 2**64 - 1


def test_hash64_accepts_non_hex_ids() -> None:
    assert hash64("bug in payment.py") == hash64("bug in payment.py") != 0
    assert hash64("not-hex-1") != hash64("not-hex-2")
    # int() takes a sign; a negative value cannot go into a ring slot (it raised
    # OverflowError from the detector, failing a whole OTLP batch on the guard).
    assert 0 < hash64("-1") < 2**64 and hash64("-1") != hash64("1")
    from guard.policy import LoopDetector

    assert LoopDetector().observe_action("-1", "-ff").level.value == "continue"


@pytest.mark.parametrize("key", [b"", "", 5, 1.5])
def test_bad_keys_are_rejected(key) -> None:
    with pytest.raises(InvalidInput):
        Fingerprinter(key)


def test_cyclic_or_too_deep_values_raise_invalid_input() -> None:
    cyclic: list = []
    cyclic.append(cyclic)
    deep: list = []
    node = deep
    for _ in range(5000):
        node.append([])
        node = node[0]
    for value in (cyclic, deep):
        with pytest.raises(InvalidInput):
            canonicalize(value)
        with pytest.raises(InvalidInput):
            Fingerprinter(b"k").action("t", value)
