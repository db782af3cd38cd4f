"""The native span decoder against the pure-Python reference: byte-exact observations.

``decode_slices`` uses the native decoder (``_otlpnative.c``) and falls back to the reference
(``_pydecode``, over the generated classes) for any request the native one does not answer
for. Held here, with hypothesis: for every request, canonical or not, well-formed or not, the
two give the same observations (values and types), rejections, errors and span counts, or
both refuse the request as malformed; the native path never accepts a request the full parse
refuses; slicing changes nothing; and the canonical shapes agents send are answered natively
(the fast path is really taken).
"""

from __future__ import annotations

import struct

import pytest
from _hyp import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.proto.common.v1 import common_pb2

from guard.errors import InvalidInput
from guard.server.decode import _nativedecode
from guard.server.decode._decode import decode_payload, decode_slices
from guard.server.decode._schema import (
    AGGREGATE_OPS,
    BOOL,
    FLOAT,
    HEX,
    INT,
    KEYS,
    KIND,
    KIND_MODEL,
    KIND_STEP,
    KIND_TOOL,
    MODEL_OPS,
    STR,
)

from .conftest import field, raw_request, raw_span, request, span, trace_id_of

pytestmark = pytest.mark.skipif(
    not _nativedecode.available(), reason="the native decoder is not built"
)
TID = trace_id_of(3)


def _outcome(data: bytes, native: bool, max_spans: int = 1 << 30):
    before = _nativedecode.set_enabled(native)
    try:
        parts = list(decode_slices(data, max_spans))
    except InvalidInput as exc:
        assert "malformed OTLP" in str(exc)
        return "malformed"
    finally:
        _nativedecode.set_enabled(before)
    obs = [o for p in parts for o in p.observations]
    errors = [e for p in parts for e in p.errors][:5]
    typed = [[(type(v).__name__, v) for v in o] for o in obs]
    return typed, sum(p.rejected for p in parts), errors, sum(p.spans for p in parts)


def _same(data: bytes) -> object:
    """Native == reference on ``data`` (and sliced native == whole); returns the outcome.

    The differential comparison of every test here: raises ``AssertionError`` where the two
    decoders differ."""
    want = _outcome(data, native=False)
    assert _outcome(data, native=True) == want
    assert _outcome(data, native=True, max_spans=2) == want  # resumed slices: the same
    return want


def _answered(data: bytes) -> bool:
    """Whether the native decoder itself answered (no fallback to the reference)."""
    return _nativedecode.decode(data, None, 1 << 30) is not None


def _full_parse_ok(data: bytes) -> bool:
    try:
        otlp.ExportTraceServiceRequest.FromString(data)
    except Exception:
        return False
    return True


def _kv(key: str, which: str | None, value: object = None) -> bytes:
    any_value = common_pb2.AnyValue()
    if which is not None:
        setattr(any_value, which, value)
    return common_pb2.KeyValue(key=key, value=any_value).SerializeToString()


# -- canonical requests: answered natively, equal to the reference ---------------------------
def _agent_request() -> bytes:
    """The shapes agents send: a model call, a failed tool call, a step, a foreign model call
    and a span that is not ours, of one request."""
    run = {"guard.run.id": "r-1", "guard.tenant": "acme", "guard.seq": 3}
    spans = [
        span(
            "chat gpt-4.1",
            TID,
            {
                **run,
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "gpt-4.1",
                "gen_ai.usage.input_tokens": 1200,
                "gen_ai.usage.output_tokens": 0,
                "gen_ai.usage.cache_read.input_tokens": 200,
                "gen_ai.response.id": "resp-1",
                "guard.cost.usd": 0.0,
            },
            span_id=b"\x01" * 8,
        ),
        span(
            "execute_tool search",
            TID,
            {**run, "guard.action.fingerprint": "ab" * 16, "guard.result.hash": "cd" * 16},
        ),
        span("guard.step", TID, {**run, "guard.step.index": 1, "guard.progress": False}),
        span("ChatCompletion", TID, {"llm.token_count.prompt": 7, "llm.model_name": "m"}),
        span("GET /", TID, {"http.method": "GET"}),
    ]
    spans[1].status.code = 2
    return request(*spans).SerializeToString()


def test_the_shapes_agents_send_are_answered_natively_and_equal():
    data = _agent_request()
    assert _answered(data)
    _typed, rejected, _errors, count = _same(data)
    assert (rejected, count) == (0, 5)
    d = decode_payload(data)
    assert [o.kind for o in d.observations] == [KIND_MODEL, KIND_TOOL, 2, KIND_MODEL]
    assert d.observations[1].error == "error" and d.observations[1].tool_name == "search"
    assert d.observations[0].cost_usd == 0.0 and d.observations[3].foreign is True


def test_every_key_of_the_table_is_answered_natively():
    good = {STR: ("string_value", "v"), HEX: ("string_value", "ab12"), INT: ("int_value", 7)}
    good |= {FLOAT: ("double_value", 0.5), BOOL: ("bool_value", True)}
    for key, (_slot, typ) in KEYS.items():
        attrs = [_kv("guard.run.id", "string_value", "r"), _kv(key, *good[typ])]
        data = raw_request(raw_span("chat m", TID, attrs))
        assert _answered(data), key
        _same(data)


@pytest.mark.parametrize(
    "attribute",
    [
        _kv("gen_ai.usage.input_tokens", "int_value", -1),  # out of range: rejected
        _kv("gen_ai.usage.input_tokens", "double_value", 12.0),  # integral double: read
        _kv("gen_ai.usage.input_tokens", "string_value", "12"),  # numeric string: read
        _kv("gen_ai.usage.input_tokens", "string_value", "²"),  # not a number: rejected
        _kv("gen_ai.usage.input_tokens", None),  # no value: rejected
        _kv("guard.cost.usd", "double_value", float("nan")),
        _kv("guard.cost.usd", "double_value", -0.0),
        _kv("guard.cost.usd", "int_value", 3),
        _kv("guard.action.fingerprint", "string_value", "xyz"),
        _kv("guard.run.id", "string_value", "r" * 300),
        _kv("guard.progress", "int_value", 1),
    ],
)
def test_values_the_native_path_leaves_to_the_reference(attribute):
    attrs = [_kv("guard.run.id", "string_value", "r"), attribute]
    _same(raw_request(raw_span("chat m", TID, attrs)))


def test_cached_above_input_is_rejected_with_the_reference_words():
    attrs = [
        _kv("guard.run.id", "string_value", "r"),
        _kv("gen_ai.usage.input_tokens", "int_value", 5),
        _kv("gen_ai.usage.cache_read.input_tokens", "int_value", 9),
    ]
    _typed, rejected, errors, _n = _same(raw_request(raw_span("chat m", TID, attrs)))
    assert rejected == 1 and "exceeds input_tokens 5" in errors[0]


# -- generated requests: canonical and odd shapes, valid and malformed ------------------------
_any_values = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(lambda n: ("int_value", n)),
    st.integers(min_value=0, max_value=1 << 30).map(lambda n: ("int_value", n)),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda d: ("double_value", d)),
    st.text(max_size=140).map(lambda s: ("string_value", s)),
    st.text("0123456789abcdefABCDEFxyz", max_size=70).map(lambda s: ("string_value", s)),
    st.booleans().map(lambda b: ("bool_value", b)),
    st.just(None),
)
_keys = st.sampled_from([*sorted(KEYS), "http.method", "gen_ai.system", "x" * 130, ""])


@st.composite
def _attribute(draw) -> bytes:
    """One serialized KeyValue: canonical, or a shape the native path must leave alone."""
    key = draw(_keys)
    typ = KEYS[key][1] if key in KEYS else None
    good = {  # mostly values the key accepts, so most spans decode and are compared in full
        INT: st.integers(0, 1 << 22).map(lambda n: ("int_value", n)),
        STR: st.text("abc-0123é", min_size=0, max_size=140).map(lambda s: ("string_value", s)),
        HEX: st.text("0123456789abcdef", min_size=1, max_size=70).map(
            lambda s: ("string_value", s)
        ),
        FLOAT: st.floats(0, 10).map(lambda d: ("double_value", d)),
        BOOL: st.booleans().map(lambda b: ("bool_value", b)),
    }.get(typ)
    if key == "gen_ai.operation.name":
        ops = ["chat", "execute_tool", "invoke_agent", "embeddings", "other", ""]
        good = st.sampled_from(ops).map(lambda s: ("string_value", s))
    value = draw(_any_values if good is None or draw(st.integers(0, 3)) == 0 else good)
    any_value = common_pb2.AnyValue()
    if value is not None:
        setattr(any_value, *value)
    key_field = field(1, 2, key.encode())
    value_field = field(2, 2, any_value.SerializeToString())
    shapes = ["swapped", "twice", "two_values", "value_twice", "trailing", "bare", "nested"]
    shape = draw(st.sampled_from(["canonical"] * 8 + shapes))
    if shape == "swapped":
        return value_field + key_field
    if shape == "twice":
        return field(1, 2, draw(_keys).encode()) + key_field + value_field
    if shape == "two_values":
        extra = field(3, 0, draw(st.integers(0, 300)))  # an int_value after the first value
        return key_field + field(2, 2, any_value.SerializeToString() + extra)
    if shape == "value_twice":  # a repeated message field merges: the last oneof member wins
        second = common_pb2.AnyValue(int_value=draw(st.integers(0, 1 << 20)))
        return key_field + value_field + field(2, 2, second.SerializeToString())
    if shape == "trailing":  # an unknown field after the value
        return key_field + value_field + field(7, 0, 1)
    if shape == "bare":
        return key_field
    if shape == "nested":  # an array of kvlists
        inner = common_pb2.KeyValueList(values=[common_pb2.KeyValue(key="a", value=any_value)])
        arr = common_pb2.ArrayValue(values=[common_pb2.AnyValue(kvlist_value=inner)])
        return key_field + field(2, 2, common_pb2.AnyValue(array_value=arr).SerializeToString())
    return key_field + value_field


_names = st.sampled_from(
    ["chat gpt-4.1", "execute_tool search", "execute_toolx", "guard.step", "invoke_agent a", "x"]
)
_extras = st.lists(
    st.sampled_from(
        [
            field(2, 2, b"\x07" * 8),  # span_id
            field(4, 2, b"\x08" * 8),  # parent_span_id
            field(15, 2, field(3, 0, 2)),  # status ERROR
            field(15, 2, field(3, 0, 1)),  # status OK
            field(15, 2, field(2, 2, b"oops") + field(3, 0, 2)),
            field(16, 5, b"\x01\x00\x00\x00"),  # flags
            field(7, 1, struct.pack("<Q", 10**18)),  # start time
            field(11, 2, field(2, 2, b"event") + field(3, 2, _kv("k", "int_value", 1))),
            field(13, 2, field(1, 2, b"\x01" * 16) + field(3, 2, b"ts")),  # a link
            field(6, 0, 3),  # kind
            field(99, 0, 1),  # an unknown field
            field(1, 2, b"\x05" * 16),  # trace_id again: the last one counts
            field(5, 2, b"guard.step"),  # the name again
        ]
    ),
    max_size=3,
)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_names, st.lists(_attribute(), max_size=8), _extras), max_size=6))
def test_generated_requests_decode_exactly_as_the_reference(batch):
    spans = [
        raw_span(name, b"\x01" * 16, attrs, **{f"x{i}": e for i, e in enumerate(extras)})
        for name, attrs, extras in batch
    ]
    data = raw_request(*spans)
    outcome = _same(data)
    assert (outcome == "malformed") == (not _full_parse_ok(data))


_broken = [
    field(1, 2, b"http.\xff\xfe") + field(2, 2, field(1, 2, b"x")),  # invalid UTF-8 key
    field(1, 2, b"gen_ai.request.model") + field(2, 2, field(1, 2, b"\xc3\x28")),
    field(1, 2, b"x") + field(2, 2, field(6, 2, b"\x0a\x05ab")),  # kvlist garbage
    field(1, 2, b"http.url") + field(2, 2, field(1, 2, b"/\xed\xa0\x80")),  # a surrogate
    field(1, 2, b"k") + field(2, 2, field(1, 2, b"\xf4\x90\x80\x80")),  # above U+10FFFF
    field(1, 2, b"k") + field(2, 2, field(1, 2, b"\xe0\x80\xaf")),  # overlong
]


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.lists(
            st.one_of(_attribute(), st.binary(max_size=24), st.sampled_from(_broken)),
            max_size=5,
        ),
        max_size=4,
    ),
    st.binary(max_size=6),
    st.integers(0, 64),
)
def test_malformed_requests_are_refused_exactly_as_the_full_parse_refuses(batch, junk, cut):
    """Bytes anywhere (random attributes, truncation, trailing junk): native and reference
    agree, and the native path never accepts what the full parse refuses."""
    data = raw_request(*(raw_span("chat x", b"\x02" * 16, attrs) for attrs in batch))
    for variant in (data, data + junk, data[: max(0, len(data) - cut)]):
        outcome = _same(variant)
        assert (outcome == "malformed") == (not _full_parse_ok(variant))
        if not _full_parse_ok(variant):
            assert not _answered(variant)


def test_deep_nesting_is_left_to_the_reference():
    value = common_pb2.AnyValue(string_value="leaf")
    for _ in range(40):
        value = common_pb2.AnyValue(array_value=common_pb2.ArrayValue(values=[value]))
    attr = common_pb2.KeyValue(key="deep", value=value).SerializeToString()
    data = raw_request(
        raw_span("chat m", TID, [_kv("gen_ai.usage.input_tokens", "int_value", 1), attr])
    )
    assert not _answered(data)
    _same(data)


def test_slices_resume_across_resource_and_scope_boundaries():
    spans = [
        span("chat m", TID, {"guard.run.id": f"r{i}", "gen_ai.usage.input_tokens": i})
        for i in range(7)
    ]
    req = request(*spans[:3])
    req.resource_spans.add().scope_spans.add().spans.extend(spans[3:5])
    req.resource_spans[1].scope_spans.add().spans.extend(spans[5:])
    data = req.SerializeToString()
    assert _answered(data)
    for size in (1, 2, 3, 7, 100):
        before = _nativedecode.set_enabled(True)
        try:
            parts = list(decode_slices(data, size))
        finally:
            _nativedecode.set_enabled(before)
        assert [p.spans for p in parts][:-1] == [size] * (len(parts) - 1)
        got = [o.run_id for p in parts for o in p.observations]
        assert got == [f"r{i}" for i in range(7)]
    _same(data)


# -- generated canonical spans: every kind of span, answered natively -------------------------
# The generated requests above are mostly odd shapes the native decoder hands back to the
# reference, or spans it rejects: in 400 of them (seed 1) no step span, no run span and no
# model call of a run decoded at all, so a reference that classified those differently went
# unnoticed. These spans are all canonical and valid, of every name, operation, run id and
# usage that decides a span's kind, and every request is answered natively.
_OPERATIONS = sorted(MODEL_OPS | AGGREGATE_OPS | {"other", ""})
_SPAN_NAMES = [
    *("guard.step", "invoke_agent bot", "execute_tool search", "execute_toolx", "chat gpt-4.1"),
    *("embeddings m", "handle_conversation_turn bot", "x", ""),
]
_kind_span = st.fixed_dictionaries(
    {
        "name": st.sampled_from(_SPAN_NAMES),
        "run": st.booleans(),
        "op": st.none() | st.sampled_from(_OPERATIONS),
        "in": st.none() | st.integers(0, 5000),
        "out": st.none() | st.integers(0, 500),
        "cached": st.none() | st.just(0),  # above the input it is rejected (tested above)
        "tool": st.none() | st.just("lookup"),
        "error": st.booleans(),
    }
)


def _kinds_request(specs: list[dict]) -> bytes:
    spans = []
    for sp in specs:
        attrs = {"guard.run.id": "r-1", "guard.tenant": "acme"} if sp["run"] else {}
        for key, value in (
            ("gen_ai.operation.name", sp["op"]),
            ("gen_ai.usage.input_tokens", sp["in"]),
            ("gen_ai.usage.output_tokens", sp["out"]),
            ("gen_ai.usage.cache_read.input_tokens", sp["cached"]),
            ("gen_ai.tool.name", sp["tool"]),
        ):
            if value is not None:
                attrs[key] = value
        one = span(sp["name"], TID, attrs, span_id=(len(spans) + 1).to_bytes(8, "big"))
        if sp["error"]:
            one.status.code = 2
        spans.append(one)
    return request(*spans).SerializeToString()


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(_kind_span, min_size=1, max_size=6))
def test_generated_spans_of_every_kind_are_classified_exactly_as_the_reference(specs):
    data = _kinds_request(specs)
    assert _answered(data)  # the native decoder's own classification, not the reference's
    _same(data)


# -- mutation checks: the comparison above fails on a deliberately changed rule ---------------
# Each changes the reference decoder's classification of spans (monkeypatch: undone after the
# test) on a request the native decoder answers itself: _same agrees without the change (the
# control) and reports a disagreement with it.


def _step_as_tool(monkeypatch: pytest.MonkeyPatch) -> None:
    """``_observe`` classifying a step span (``guard.step``) as a tool call."""
    from guard.server.decode import _pydecode

    real = _pydecode._observe

    def observe(span, o):
        o = real(span, o)
        if o is not None and o[KIND] == KIND_STEP:
            o[KIND] = KIND_TOOL
        return o

    monkeypatch.setattr(_pydecode, "_observe", observe)


def _aggregates_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """No operation counted as an aggregate: a foreign agent span's usage (a sum of its model
    calls) counted as one more model call."""
    from guard.server.decode import _pydecode

    monkeypatch.setattr(_pydecode, "AGGREGATE_OPS", frozenset())


_AGGREGATE = request(
    span(
        "invoke_agent bot",
        TID,
        {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.usage.input_tokens": 4000,
            "gen_ai.usage.output_tokens": 400,
        },
    )
).SerializeToString()


@pytest.mark.parametrize(
    ("mutate", "data"),
    [(_step_as_tool, _agent_request()), (_aggregates_count, _AGGREGATE)],
    ids=["a_step_span_as_a_tool_call", "an_aggregate_span_as_a_model_call"],
)
def test_a_changed_span_classification_is_caught_by_the_native_decode_differential(
    monkeypatch: pytest.MonkeyPatch, mutate, data: bytes
) -> None:
    assert _answered(data)  # the native decoder answers: its own rules, not the reference's
    _same(data)  # the control: the decoders agree
    mutate(monkeypatch)
    with pytest.raises(AssertionError):
        _same(data)


def test_a_changed_span_classification_is_caught_by_the_alias_differential(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The comparison of tests/server/test_decode_aliases.py (``_both``; here, where the native
    decoder is built, since without it ``_both`` compares the reference with itself): the
    reference counting no operation as an aggregate makes an agent span carrying its calls'
    summed usage a model call there, not in the native decoder, and ``_both`` says so."""
    from .test_decode_aliases import _both

    attrs = {
        "gen_ai.operation.name": "handle_conversation_turn",
        "gen_ai.usage.input_tokens": 4000,
        "gen_ai.usage.output_tokens": 400,
    }
    assert _both(span("handle_conversation_turn bot", TID, attrs)).observations == []  # control
    _aggregates_count(monkeypatch)
    with pytest.raises(AssertionError):
        _both(span("handle_conversation_turn bot", TID, attrs))
