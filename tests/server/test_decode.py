"""The pure OTLP translation layer: spellings, kinds, rejection of bad counters."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.proto.common.v1 import common_pb2

from guard.errors import InvalidInput
from guard.server import decode_request, decode_spans
from guard.server._decode import (
    _BOOL,
    _FLOAT,
    _HEX,
    _INT,
    _KEYS,
    _STR,
    KIND_MODEL,
    KIND_RUN,
    KIND_STEP,
    KIND_TOOL,
    Decoded,
)
from guard.server._rawdecode import LiteRequest, decode_payload

from .conftest import model_span, request, span, step_span, tool_span, trace_id_of

TID = trace_id_of(99)


def test_current_spellings_model_tool_step_run():
    spans = [
        model_span(
            "r",
            TID,
            tokens_in=1200,
            tokens_out=90,
            **{
                "gen_ai.usage.cache_read.input_tokens": 200,
                "gen_ai.usage.reasoning.output_tokens": 30,
                "guard.cost.usd": 0.0123,
                "gen_ai.response.id": "resp-1",
                "gen_ai.provider.name": "openai",
            },
        ),
        tool_span("r", TID, "ab" * 16, "cd" * 16),
        step_span("r", TID, 3, **{"guard.progress": True, "guard.state.hash": "ef" * 16}),
        span(
            "invoke_agent bot",
            TID,
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "bot",
                "guard.run.id": "r",
                "guard.tenant": "acme",
                "guard.stop.status": "terminated",
                "guard.stop.reason": "max_steps",
            },
        ),
    ]
    d = decode_request(request(*spans))
    assert d.rejected == 0 and d.spans == 4
    m, t, s, r = d.observations
    assert m.kind == KIND_MODEL and not m.foreign
    assert (m.input_tokens, m.output_tokens, m.cached_tokens, m.reasoning_tokens) == (
        1200,
        90,
        200,
        30,
    )
    assert m.cost_usd == 0.0123 and m.response_id == "resp-1" and m.model == "gpt-4.1"
    assert t.kind == KIND_TOOL and t.action_fp == "ab" * 16 and t.tool_name == "search"
    assert s.kind == KIND_STEP and s.step_index == 3 and s.progress is True
    assert r.kind == KIND_RUN and r.stop_reason == "max_steps" and r.tenant == "acme"


def test_previous_spellings_and_openinference():
    old = span(
        "chat gpt-4",
        TID,
        {
            "gen_ai.system": "openai",
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "gpt-4",
            "gen_ai.usage.prompt_tokens": 50,
            "gen_ai.usage.completion_tokens": 5,
            "gen_ai.usage.cache_creation.input_tokens": 10,
            "guard.run.id": "r",
        },
    )
    oi = span(
        "llm",
        TID,
        {"llm.model_name": "gpt-4.1", "llm.token_count.prompt": 7, "llm.token_count.completion": 3},
    )
    d = decode_request(request(old, oi))
    assert d.rejected == 0
    a, b = d.observations
    assert (a.input_tokens, a.output_tokens, a.foreign) == (50, 5, False)
    assert (b.input_tokens, b.output_tokens, b.foreign, b.model) == (7, 3, True, "gpt-4.1")


def test_non_genai_spans_are_skipped():
    http = span("GET /", TID, {"http.method": "GET", "http.status_code": 200})
    agent = span(
        "invoke_agent x",
        TID,
        {"gen_ai.operation.name": "invoke_agent", "gen_ai.usage.input_tokens": 900},
    )
    d = decode_request(request(http, agent))
    assert d.observations == [] and d.rejected == 0 and d.spans == 2


def test_bad_counters_are_rejected_not_applied():
    bad = [
        model_span("r", TID, tokens_in=-5),
        model_span("r", TID, **{"guard.cost.usd": math.nan}),
        model_span("r", TID, **{"guard.cost.usd": -1.0}),
        model_span("r", TID, **{"gen_ai.usage.output_tokens": "lots"}),
        tool_span("r", TID, "not hex!"),
        model_span("r" * 300, TID),
        model_span("r", TID, tokens_in=10, **{"gen_ai.usage.cache_read.input_tokens": 20}),
    ]
    d = decode_request(request(*bad, model_span("ok", TID)))
    assert d.rejected == len(bad)
    assert [o.run_id for o in d.observations] == ["ok"]
    assert d.errors and "out of range" in d.errors[0]


def test_failed_tool_call_is_marked_from_the_span_status():
    failed, ok = tool_span("r", TID, "ab" * 16), tool_span("r", TID, "cd" * 16)
    failed.status.code = 2  # STATUS_CODE_ERROR
    ok.status.code = 1  # STATUS_CODE_OK
    d = decode_request(request(failed, ok))
    assert [o.error for o in d.observations] == ["error", None]


def test_integral_doubles_and_numeric_strings_are_counters():
    s = model_span("r", TID, tokens_in=12.0, tokens_out="7")
    d = decode_request(request(s))
    assert (d.observations[0].input_tokens, d.observations[0].output_tokens) == (12, 7)


# -- the fast path (guard.server._rawdecode) against the reference (decode_spans) ----------


def _field(number: int, wire: int, payload: bytes | int) -> bytes:
    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            b, n = n & 0x7F, n >> 7
            out.append(b | (0x80 if n else 0))
            if not n:
                return bytes(out)

    tag = varint(number << 3 | wire)
    if wire == 0:
        return tag + varint(payload)  # type: ignore[arg-type]
    return tag + varint(len(payload)) + payload  # type: ignore[arg-type]


_any_values = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(lambda n: ("int_value", n)),
    st.integers(min_value=0, max_value=1 << 30).map(lambda n: ("int_value", n)),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda d: ("double_value", d)),
    st.text(max_size=140).map(lambda s: ("string_value", s)),
    st.text("0123456789abcdefABCDEFxyz", max_size=70).map(lambda s: ("string_value", s)),
    st.booleans().map(lambda b: ("bool_value", b)),
    st.just(None),
)
_keys = st.sampled_from([*sorted(_KEYS), "http.method", "gen_ai.system", "x" * 130, ""])


@st.composite
def _raw_attribute(draw) -> bytes:
    """One serialized KeyValue: canonical, or one of the shapes the fast path must refuse."""
    key = draw(_keys)
    typ = _KEYS[key][1] if key in _KEYS else None
    good = {  # mostly values the key accepts, so most spans decode and are compared in full
        _INT: st.integers(0, 1 << 22).map(lambda n: ("int_value", n)),
        _STR: st.text("abc-0123", min_size=1, max_size=140).map(lambda s: ("string_value", s)),
        _HEX: st.text("0123456789abcdef", min_size=1, max_size=70).map(
            lambda s: ("string_value", s)
        ),
        _FLOAT: st.floats(0, 10).map(lambda d: ("double_value", d)),
        _BOOL: st.booleans().map(lambda b: ("bool_value", b)),
    }.get(typ)
    if key == "gen_ai.operation.name":
        ops = ["chat", "execute_tool", "invoke_agent", "embeddings", "other"]
        good = st.sampled_from(ops).map(lambda s: ("string_value", s))
    value = draw(_any_values if good is None or draw(st.integers(0, 3)) == 0 else good)
    any_value = common_pb2.AnyValue()
    if value is not None:
        setattr(any_value, *value)
    key_field = _field(1, 2, key.encode())
    value_field = _field(2, 2, any_value.SerializeToString())
    shapes = ["swapped", "twice", "two_values", "value_twice", "trailing", "bare"]
    shape = draw(st.sampled_from(["canonical"] * 6 + shapes))
    if shape == "swapped":
        return value_field + key_field
    if shape == "twice":
        other = draw(_keys).encode()
        return _field(1, 2, other) + key_field + value_field
    if shape == "two_values":
        extra = _field(3, 0, draw(st.integers(0, 300)))  # an int_value after the first value
        return key_field + _field(2, 2, any_value.SerializeToString() + extra)
    if shape == "value_twice":  # a repeated message field merges: the last oneof member wins
        second = common_pb2.AnyValue(int_value=draw(st.integers(0, 1 << 20)))
        return key_field + value_field + _field(2, 2, second.SerializeToString())
    if shape == "trailing":  # an unknown field after the value
        return key_field + value_field + _field(7, 0, 1)
    if shape == "bare":
        return key_field
    return key_field + value_field


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                ["chat gpt-4.1", "execute_tool search", "guard.step", "invoke_agent", "x"]
            ),
            st.lists(_raw_attribute(), max_size=8),
            st.integers(0, 2),
        ),
        max_size=6,
    )
)
def test_fast_decode_matches_the_reference(batch):
    spans = [
        {
            "name": name,
            "trace_id": b"\x01" * 16,
            "span_id": bytes([i + 1]) * 8,
            "attributes": attrs,
            "status": {"code": status},
        }
        for i, (name, attrs, status) in enumerate(batch)
    ]
    data = LiteRequest(resource_spans=[{"scope_spans": [{"spans": spans}]}]).SerializeToString()
    try:
        full = otlp.ExportTraceServiceRequest.FromString(data)
    except Exception:  # e.g. invalid UTF-8: refused before decoding, as INVALID_ARGUMENT
        return
    want = Decoded()
    for rs in full.resource_spans:
        for ss in rs.scope_spans:
            decode_spans(ss.spans, want)
    got = decode_payload(data)
    assert [list(o) for o in got.observations] == [list(o) for o in want.observations]
    assert (got.rejected, got.errors, got.spans) == (want.rejected, want.errors, want.spans)
    again = decode_payload(data)  # answered from the memo this time
    assert [list(o) for o in again.observations] == [list(o) for o in want.observations]


_bad_utf8 = _field(1, 2, b"http.\xff\xfe") + _field(2, 2, _field(1, 2, b"x"))
_bad_value = _field(1, 2, b"gen_ai.request.model") + _field(2, 2, _field(1, 2, b"\xc3\x28"))
_bad_nested = _field(1, 2, b"x") + _field(2, 2, _field(6, 2, b"\x0a\x05ab"))  # kvlist garbage
_bad_other = _field(1, 2, b"http.url") + _field(2, 2, _field(1, 2, b"/\xed\xa0\x80"))  # surrogate


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.lists(
            st.one_of(
                _raw_attribute(),
                st.binary(max_size=24),
                st.sampled_from([_bad_utf8, _bad_value, _bad_nested, _bad_other]),
            ),
            max_size=5,
        ),
        max_size=4,
    )
)
def test_fast_decode_refuses_exactly_what_the_full_parse_refuses(batch):
    """One parse with attributes as bytes + validation while decoding == the full parse."""
    spans = [{"name": "chat x", "trace_id": b"\x02" * 16, "attributes": a} for a in batch]
    data = LiteRequest(resource_spans=[{"scope_spans": [{"spans": spans}]}]).SerializeToString()
    try:
        otlp.ExportTraceServiceRequest.FromString(data)
        full_ok = True
    except Exception:
        full_ok = False
    try:
        decode_payload(data)
        fast_ok = True
    except InvalidInput as exc:
        assert "malformed OTLP" in str(exc)
        fast_ok = False
    assert fast_ok == full_ok


def test_fast_decode_kinds_match_the_reference_for_every_name_and_operation():
    names = ["guard.step", "execute_tool x", "execute_toolx", "invoke_agent a", "chat m", "x"]
    ops = [None, "execute_tool", "invoke_agent", "chat", "other"]
    batch = []
    for name in names:
        for op in ops:
            attrs = {"guard.run.id": "r", **({"gen_ai.operation.name": op} if op else {})}
            batch.append(span(name, TID, attrs))
            batch.append(span(name, TID, {**attrs, "gen_ai.usage.input_tokens": 3}))
    req = request(*batch)
    want = decode_spans(req.resource_spans[0].scope_spans[0].spans)
    got = decode_payload(req.SerializeToString())
    assert [list(o) for o in got.observations] == [list(o) for o in want.observations]
    assert {o.kind for o in got.observations} == {KIND_STEP, KIND_TOOL, KIND_RUN, KIND_MODEL}


def _kv_raw(key: str, value: bytes) -> bytes:
    return _field(1, 2, key.encode()) + _field(2, 2, _field(1, 2, value))


def _compare_with_reference(spans_attrs: list[list[bytes]]) -> None:
    spans = [
        {"name": "execute_tool t", "trace_id": b"\x03" * 16, "attributes": a} for a in spans_attrs
    ]
    data = LiteRequest(resource_spans=[{"scope_spans": [{"spans": spans}]}]).SerializeToString()
    try:
        full = otlp.ExportTraceServiceRequest.FromString(data)
    except Exception:
        with pytest.raises(InvalidInput, match="malformed OTLP"):
            decode_payload(data)
        return
    want = decode_spans(full.resource_spans[0].scope_spans[0].spans)
    got = decode_payload(data)
    assert [list(o) for o in got.observations] == [list(o) for o in want.observations]
    assert (got.rejected, got.errors) == (want.rejected, want.errors)


@pytest.mark.parametrize(
    "key",
    ["http.url", "gen_ai.tool.call.id", "guard.result.hash", "guard.action.fingerprint"],
)
@pytest.mark.parametrize(
    "second",
    [b"abcdef01", b"ABCDEF01", b"abcdefXY", b"/\xed\xa0\x80abcd", b"\xc3\x28abcdef", b"12345678"],
)
def test_values_read_from_a_known_head_are_checked_like_the_reference(key, second):
    """The decoder reads per-call values (hashes, ids, skipped strings) from their head once it
    has seen it: a later value of the same length under the same key must still be validated
    (hex digits, UTF-8) exactly as the full parse and the reference decoder do."""
    run = _kv_raw("guard.run.id", b"r")
    first = [run, _kv_raw(key, b"0123abcd")]
    _compare_with_reference([first, first])  # the head is learnt
    _compare_with_reference([first, [run, _kv_raw(key, second)]])
