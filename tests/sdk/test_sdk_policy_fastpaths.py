"""The SDK's hot-path shortcuts in the policy engine change no decision and no fingerprint.

Fingerprints are stored (ClickHouse, the guard's loop windows), so they must stay the same
for the same key and input across versions: golden values computed by the previous
implementation, and property tests against reference copies of the code paths that were
given fast paths (string canonicalisation, JSON encoding, HMAC). Decisions: the quick
pre-check never hides a decision stronger than the caller's level.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guard.errors import InvalidInput
from guard.policy import Action, Budget, Fingerprinter, Limits, LoopSettings, Phase, Usage, decide
from guard.policy import _fingerprint as F
from guard.policy._decide import could_act
from guard.policy._loops import LoopVerdict
from guard.policy._types import Reason

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


@settings(max_examples=200, deadline=None)
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


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
            b"action", "t\x00" + F.canonicalize(args, ignore_fields=("page",))
        ), impl
        assert fp.result(args) == fp._mac(b"result", F.canonicalize(args)), impl


# -- reference copies of the string canonicalisation before its fast paths ----------------
_REF_WS = re.compile(r"\s+")


def _ref_norm(s: str) -> str:
    if not s.isascii():
        s = unicodedata.normalize("NFKC", s)
    return _REF_WS.sub(" ", s).strip().casefold()


def _ref_string(s: str) -> object:
    s = _ref_norm(s)
    if F._NUM.fullmatch(s):
        return F._numeric(s)
    if s in F._SPECIAL:
        return F._SPECIAL[s]
    if s[:4].isdigit():
        d = F._date(s)
        if d is not None:
            return d
    if (
        len(s) <= F.SHORT_MAX_CHARS
        and s.count(" ") < F.SHORT_MAX_TOKENS
        and (" " in s or F._HAS_CJK.search(s) is not None)
    ):
        tokens = F._TOKEN.findall(s)
        if tokens:
            joined = " ".join(sorted(tokens))
            return F._numeric(joined) if F._NUM.fullmatch(joined) else joined
    return s


_ASCIIISH = st.text(
    alphabet=st.sampled_from([*list("abcXYZ019 _-+.:/\t\n\x1f\x7f"), "é", "杭", "州", "١", "²"]),
    max_size=40,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(s=st.one_of(_ASCIIISH, st.text(max_size=70), st.from_regex(r"[+-]?\d{1,5}(\.\d*)?")))
def test_string_fast_paths_match_the_reference(s: str) -> None:
    got, want = F._string_cached.__wrapped__(s), _ref_string(s)
    assert type(got) is type(want) and (got == want or (got != got and want != want)), s
    assert F._norm(s) == _ref_norm(s)


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


@settings(max_examples=300, deadline=None)
@given(value=_JSONISH)
def test_prebuilt_json_encoder_matches_json_encoder(value: object) -> None:
    ref = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode
    canon = F._canon(value, frozenset())
    assert F._dump(canon) == ref(canon)


# -- the quick decision pre-check -------------------------------------------------------
_RANK = {Action.CONTINUE: 0, Action.WARN: 1, Action.WRAP_UP: 2, Action.STOP: 3}
_opt_int = st.one_of(st.none(), st.integers(min_value=0, max_value=50))
_opt_float = st.one_of(st.none(), st.floats(min_value=0, max_value=50, allow_nan=False))


@st.composite
def _limits(draw: st.DrawFn) -> Limits:
    soft = draw(
        st.one_of(
            st.just(()),
            st.tuples(st.floats(min_value=0, max_value=1.2)),
            st.tuples(st.floats(min_value=0, max_value=1.2), st.floats(min_value=0, max_value=1.2)),
        )
    )
    return Limits(
        max_steps=draw(_opt_int),
        max_tool_calls=draw(_opt_int),
        max_model_calls=draw(_opt_int),
        max_tokens=draw(st.one_of(st.none(), st.integers(min_value=0, max_value=5000))),
        max_cost_usd=draw(_opt_float),
        deadline_s=draw(_opt_float),
        reserve_tokens=draw(st.one_of(st.none(), st.integers(min_value=0, max_value=2000))),
        reserve_s=draw(st.one_of(st.none(), st.floats(min_value=0, max_value=20))),
        soft_thresholds=soft,
    )


@st.composite
def _usage(draw: st.DrawFn) -> Usage:
    return Usage(
        steps=draw(st.integers(0, 60)),
        model_calls=draw(st.integers(0, 60)),
        tool_calls=draw(st.integers(0, 60)),
        input_tokens=draw(st.integers(0, 6000)),
        output_tokens=draw(st.integers(0, 600)),
        cost_usd=draw(st.one_of(st.none(), st.floats(min_value=0, max_value=60))),
    )


@settings(max_examples=700, deadline=None)
@given(
    limits=_limits(),
    usage=_usage(),
    elapsed=st.one_of(st.none(), st.floats(min_value=0, max_value=60)),
    reserved=st.one_of(st.none(), _usage()),
    phase=st.sampled_from(list(Phase)),
    above=st.sampled_from([Action.CONTINUE, Action.WARN, Action.WRAP_UP, Action.STOP]),
)
def test_could_act_never_hides_a_stronger_decision(
    limits: Limits,
    usage: Usage,
    elapsed: float | None,
    reserved: Usage | None,
    phase: Phase,
    above: Action,
) -> None:
    d = decide(limits, usage, elapsed_s=elapsed, phase=phase, reserved=reserved)
    if not could_act(limits, usage, elapsed_s=elapsed, reserved=reserved, above=above):
        assert _RANK[d.action] <= _RANK[above], (d, above)


def test_could_act_at_exact_trigger_points() -> None:
    """Usage exactly at a soft threshold or limit, where float rounding could bite."""
    for limit in (3, 7, 10, 12, 100, 1000, 60_000):
        for frac in (0.7, 0.9, 1.0, 0.333, 0.1):
            lim = Limits(max_tokens=limit, max_steps=limit, soft_thresholds=(frac, frac))
            for used in range(max(0, int(limit * frac) - 2), int(limit * frac) + 3):
                u = Usage(input_tokens=used, steps=used)
                d = decide(lim, u, elapsed_s=None)
                if not could_act(lim, u, elapsed_s=None):
                    assert d.action is Action.CONTINUE, (limit, frac, used, d)


def test_budget_decide_quick_is_decide_or_nothing_stronger() -> None:
    t = [0.0]
    b = Budget(
        Limits(max_steps=10, max_tokens=1000, deadline_s=10.0, reserve_tokens=100),
        clock=lambda: t[0],
    )
    stop = LoopVerdict(Action.STOP, Reason.LOOP_DETECTED, "exact_repeat", 3, "looping")
    for _i in range(12):
        for phase in Phase:
            for above in (Action.CONTINUE, Action.WARN, Action.WRAP_UP):
                for loop in (None, stop):
                    q = b.decide_quick(phase=phase, loop=loop, above=above)
                    d = b.decide(phase=phase, loop=loop)
                    if q is None:
                        assert _RANK[d.action] <= _RANK[above]
                    else:
                        assert q == d
        b.record_step()
        b.record_model_call(input_tokens=80, output_tokens=5)
        t[0] += 0.9
    assert b.decide_quick(loop=stop, above=Action.WRAP_UP) is not None  # a stop always shows


def test_budget_fused_hot_paths_are_record_then_decide_quick() -> None:
    """step_if_quiet / model_call_quick / tool_calls_quick (one lock each, what the SDK runs)
    leave the same usage and return the same decision as record_*() then decide_quick()."""
    t = [0.0]
    cases = [
        Limits(max_steps=10, max_tokens=1000, deadline_s=10.0, reserve_tokens=100),
        Limits(max_tool_calls=6, max_cost_usd=0.01, soft_thresholds=(0.5, 0.8)),
        Limits(max_model_calls=5, reserve_s=2.0, deadline_s=6.0),
        Limits(),
    ]
    stop = LoopVerdict(Action.STOP, Reason.LOOP_DETECTED, "exact_repeat", 3, "looping")
    warn = LoopVerdict(Action.WARN, Reason.LOOP_DETECTED, "exact_repeat", 2, "looping")
    for limits in cases:
        for rank, above in enumerate((Action.CONTINUE, Action.WARN, Action.WRAP_UP)):
            t[0] = 0.0
            fused = Budget(limits, clock=lambda: t[0])
            ref = Budget(limits, clock=lambda: t[0])
            for i in range(12):
                want = ref.decide_quick(phase=Phase.BEFORE_STEP, above=above)
                recorded = fused.step_if_quiet(rank)
                assert bool(recorded) == (want is None)
                if not recorded:
                    recorded = fused.record_step()
                assert recorded == ref.record_step() == fused.seq  # one number per record
                cost = 0.0011 * (i % 3) if i % 2 else None
                seq, q = fused.model_call_quick(90 + i, 7, 2, 10, cost, rank)
                assert seq == fused.seq
                ref.record_model_call(
                    input_tokens=90 + i,
                    output_tokens=7,
                    reasoning_tokens=2,
                    cached_tokens=10,
                    cost_usd=cost,
                )
                assert q == ref.decide_quick(phase=Phase.AFTER_MODEL_CALL, above=above)
                loop = (None, warn, stop)[i % 3]
                seq, q = fused.tool_calls_quick(1 + i % 2, None, loop, rank)
                assert seq == ref.record_tool_calls(1, attempts=1 + i % 2) == fused.seq
                want = ref.decide_quick(phase=Phase.AFTER_TOOL_BATCH, loop=loop, above=above)
                assert q == want
                assert fused.usage() == ref.usage()
                t[0] += 0.7
    b = Budget(Limits())
    with pytest.raises(InvalidInput, match="input_tokens"):  # record_model_call's validation
        b.model_call_quick(-1, 0, 0, 0, None)
    assert b.usage() == Usage()


def test_loop_settings_default_is_unchanged() -> None:
    assert LoopSettings() == LoopSettings(window=20, repeat_threshold=3, no_progress_steps=8)
