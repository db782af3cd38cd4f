"""The pure OTLP translation layer: spellings, kinds, rejection of bad counters."""

from __future__ import annotations

import math

import pytest

from guard.server import decode_request
from guard.server.decode._schema import (
    KIND_MODEL,
    KIND_RUN,
    KIND_STEP,
    KIND_TOOL,
)

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


@pytest.mark.parametrize("text", ["²", "١٢", "٣"])  # digits to str.isdigit(), not to int()
def test_non_ascii_digit_strings_are_rejected_not_a_crash(text):
    """A counter given as "²" (``str.isdigit()`` is True, ``int("²")`` raises) is a rejected
    span with the reference's words, never an exception out of the decoder."""
    d = decode_request(request(model_span("r", TID, tokens_in=text)))
    assert d.rejected == 1 and "expected an integer" in d.errors[0]
