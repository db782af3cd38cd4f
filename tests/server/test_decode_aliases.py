"""The guard's decoders read usage through the one alias table of ``guard.semconv``.

Every spelling of the table decodes to its field, through the reference decoder and through
the native decoder, configured from the same table (``_schema.KEYS``) at import; foreign
spans of every instrumentation count with their own spellings (OpenInference reasoning and
cache writes, Pydantic AI's ``gen_ai.usage.details.*``), and aggregate operations
(``handle_conversation_turn`` too) never count as a call.
"""

from __future__ import annotations

import pytest

from guard.semconv import AGGREGATE_OPERATIONS, USAGE_ATTRIBUTES, USAGE_KEYS
from guard.server import decode_spans
from guard.server.decode import _nativedecode
from guard.server.decode._decode import decode_payload
from guard.server.decode._schema import KEYS as _KEYS
from guard.server.decode._schema import KIND_MODEL
from guard.server.decode._schema import USAGE_SLOTS as _USAGE_SLOTS

from .conftest import request, span, trace_id_of

TID = trace_id_of(7)
FIELD_OF_SLOT = {slot: field for field, (slot, _typ) in _USAGE_SLOTS.items()}
READ = {  # decoded field -> Observation property
    "input_tokens": "input_tokens",
    "output_tokens": "output_tokens",
    "cache_read_tokens": "cached_tokens",
    "reasoning_tokens": "reasoning_tokens",
    "model": "model",
    "response_id": "response_id",
}


def _both(*spans):
    """Observations of the reference decoder and of the native one (they must agree: the
    differential comparison, raising ``AssertionError`` where they do not)."""
    req = request(*spans)
    ref = decode_spans([s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans])
    fast = decode_payload(req.SerializeToString())
    if _nativedecode.available() and not ref.rejected:  # answered natively, no fallback
        assert _nativedecode.decode(req.SerializeToString(), None, 1 << 30) is not None
    assert [list(o) for o in ref.observations] == [list(o) for o in fast.observations]
    assert (ref.rejected, ref.errors) == (fast.rejected, fast.errors)
    return fast


def test_the_decoders_read_exactly_the_alias_table() -> None:
    table = {k: f for k, f in USAGE_KEYS.items() if f in _USAGE_SLOTS}
    decoded = {k: FIELD_OF_SLOT[slot] for k, (slot, _t) in _KEYS.items() if slot in FIELD_OF_SLOT}
    assert decoded == table  # no spelling of the table missing, none read outside it


@pytest.mark.parametrize(
    ("field", "key"), [(f, k) for f in READ for k in USAGE_ATTRIBUTES[f]], ids=lambda v: v
)
def test_every_spelling_of_a_field_decodes_to_it(field: str, key: str) -> None:
    value = "m-1" if field in ("model", "response_id") else 17
    attrs = {"gen_ai.usage.input_tokens": 40, "gen_ai.usage.output_tokens": 20, key: value}
    d = _both(span("x", TID, attrs))
    (o,) = d.observations
    assert o.kind == KIND_MODEL and o.foreign
    assert getattr(o, READ[field]) == value


@pytest.mark.parametrize(
    ("emitter", "attrs", "expected"),
    [
        (
            "openinference",
            {
                "openinference.span.kind": "LLM",
                "llm.model_name": "gpt-4.1",
                "llm.token_count.prompt": 1000,
                "llm.token_count.completion": 300,
                "llm.token_count.prompt_details.cache_read": 200,
                "llm.token_count.prompt_details.cache_write": 50,
                "llm.token_count.completion_details.reasoning": 120,
            },
            (1000, 300, 200, 120),
        ),
        (
            "pydantic-ai",
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "gpt-4.1",
                "gen_ai.usage.input_tokens": 900,
                "gen_ai.usage.output_tokens": 80,
                "gen_ai.usage.details.cache_read_tokens": 300,
                "gen_ai.usage.details.cache_write_tokens": 10,
                "gen_ai.usage.details.reasoning_tokens": 40,
            },
            (900, 80, 300, 40),
        ),
        (
            "openllmetry-older",
            {
                "gen_ai.usage.prompt_tokens": 500,
                "gen_ai.usage.completion_tokens": 50,
                "gen_ai.usage.cache_read_input_tokens": 100,
                "gen_ai.usage.cache_creation_input_tokens": 20,
                "gen_ai.usage.reasoning_tokens": 7,
            },
            (500, 50, 100, 7),
        ),
        (
            "semconv-now",
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.usage.input_tokens": 600,
                "gen_ai.usage.output_tokens": 60,
                "gen_ai.usage.cache_read.input_tokens": 60,
                "gen_ai.usage.cache_write.input_tokens": 6,
                "gen_ai.usage.reasoning.output_tokens": 9,
            },
            (600, 60, 60, 9),
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_foreign_usage_of_each_emitter(emitter: str, attrs: dict, expected: tuple) -> None:
    (o,) = _both(span("call", TID, attrs)).observations
    assert o.kind == KIND_MODEL and o.foreign
    assert (o.input_tokens, o.output_tokens, o.cached_tokens, o.reasoning_tokens) == expected


@pytest.mark.parametrize("operation", sorted(AGGREGATE_OPERATIONS))
def test_aggregate_operations_never_count_as_a_call(operation: str) -> None:
    attrs = {
        "gen_ai.operation.name": operation,
        "gen_ai.usage.input_tokens": 4000,
        "gen_ai.usage.output_tokens": 400,
    }
    assert _both(span(f"{operation} bot", TID, attrs)).observations == []
    assert "handle_conversation_turn" in AGGREGATE_OPERATIONS  # the runner entrypoint (571)


def test_a_bad_counter_under_a_new_spelling_is_refused() -> None:
    attrs = {"gen_ai.usage.input_tokens": 10, "llm.token_count.completion_details.reasoning": -3}
    d = _both(span("call", TID, attrs))
    assert d.observations == [] and d.rejected == 1
    assert "out of range" in d.errors[0]
