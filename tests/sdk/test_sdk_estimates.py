"""Estimates before a model call: split pricing, ``step.reserve(input_tokens=, output_tokens=)``
and the integrations' whole-request estimate (``guard.integrations._estimate``)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import tiktoken

import guard
from guard.errors import InvalidInput
from guard.integrations import _estimate
from guard.integrations._estimate import (
    DEFAULT_OUTPUT_TOKENS,
    NON_TEXT_PART_TOKENS,
    Prompt,
    count_text_tokens,
    model_output_limit,
    output_tokens,
    prompt_tokens,
    request_prompt,
)
from guard.policy import ModelPrice, PriceBook
from guard.sdk._reserve import estimate_cost
from guard.sdk._run import current_run_or_none
from guard.testing import SpanSink, capture_spans

BOOK = PriceBook("test", {"m": ModelPrice(6.0, 20.0)})  # $6/M in, $20/M out


@pytest.fixture
def priced() -> Iterator[SpanSink]:
    with capture_spans(hmac_key=b"test-key-0123456789", price_book=BOOK) as s:
        yield s


@pytest.fixture
def fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """The char-based count, whatever this machine's tiktoken can load."""
    monkeypatch.setattr(_estimate, "_tiktoken_broken", True)


# -- pricing -----------------------------------------------------------------------------------
def test_estimate_cost_prices_input_and_output_at_their_own_rates(priced: SpanSink) -> None:
    seen = {}

    @guard.run(agent="e")
    def agent() -> None:
        run = current_run_or_none()
        seen["split"] = estimate_cost(run, "m", 1000, 200)
        seen["input_only"] = estimate_cost(run, "m", 1000, 0)
        seen["total"] = estimate_cost(run, "m", 1200)  # no split: every token at the dearer rate
        seen["unpriced"] = estimate_cost(run, "nope", 1000, 200)

    agent()
    assert seen["split"] == pytest.approx(0.006 + 0.004)
    assert seen["input_only"] == pytest.approx(0.006)
    assert seen["total"] == pytest.approx(1200 * 20 / 1e6)
    assert seen["unpriced"] == 0.0


def test_reserve_with_a_split_holds_its_cost_and_tokens(priced: SpanSink) -> None:
    seen = {}

    @guard.run(agent="e", max_cost_usd=1.0)
    def agent() -> None:
        run = current_run_or_none()
        with guard.step() as step:
            with step.reserve(input_tokens=1000, output_tokens=200, model="m"):
                seen["held"] = run.budget.reserved()
                # the actual (less than held) settles it: the rest is released
                step.model_call(model="m", input_tokens=500, output_tokens=50)
                seen["settled"] = run.budget.reserved()
            with step.reserve(input_tokens=300, model="m"):  # output left out: 0
                seen["input_only"] = run.budget.reserved()
        seen["usage"] = run.budget.usage()

    agent()
    assert seen["held"].cost_usd == pytest.approx(0.01) and seen["held"].tokens == 1200
    assert seen["settled"].cost_usd == pytest.approx(0.0) and seen["settled"].tokens == 0
    assert seen["input_only"].cost_usd == pytest.approx(0.0018)
    assert seen["input_only"].tokens == 300
    assert seen["usage"].cost_usd == pytest.approx(0.003 + 0.001)  # the actual, once


def test_a_split_reservation_is_refused_exactly_when_the_budget_cannot_cover_it(
    priced: SpanSink,
) -> None:
    @guard.run(agent="fits", max_cost_usd=0.01)
    def fits() -> None:
        with guard.step() as step, step.reserve(input_tokens=1000, output_tokens=200, model="m"):
            pass  # 0.006 + 0.004 = 0.01: exactly covered

    @guard.run(agent="over", max_cost_usd=0.01)
    def over() -> None:
        with guard.step() as step, step.reserve(input_tokens=1000, output_tokens=201, model="m"):
            pytest.fail("a reservation over the budget let the call go")

    fits()
    with pytest.raises(guard.RunStopped) as stop:
        over()
    o = stop.value.outcome
    assert (o.reason, o.model_calls) == ("cost_budget", 0)
    assert "reservation refused" in o.message, o.message


def test_tokens_and_a_split_together_are_invalid(priced: SpanSink) -> None:
    @guard.run(agent="e")
    def agent() -> None:
        with guard.step() as step:
            with pytest.raises(InvalidInput) as both:
                step.reserve(tokens=500, input_tokens=400, output_tokens=100, model="m")
            assert "tokens=500" in str(both.value) and "input_tokens=400" in str(both.value)
            assert "output_tokens=100" in str(both.value)
            with pytest.raises(InvalidInput, match="input_tokens"):
                step.reserve(input_tokens=-1, model="m")
            with pytest.raises(InvalidInput, match="output_tokens"):
                step.reserve(output_tokens=1.5, model="m")  # type: ignore[arg-type]

    agent()


# -- counting a prompt -------------------------------------------------------------------------
_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Look up an order by its id and return its status and items.",
        "parameters": {
            "type": "object",
            "properties": {
                "order_id": {"type": "string", "description": "The order id, e.g. A-1042"},
                "include_items": {"type": "boolean"},
            },
            "required": ["order_id"],
        },
    },
}
CORPUS = [
    "You are a helpful customer-support assistant for an online bookshop. Answer briefly.",
    "Hi! I ordered two books last Tuesday (order A-1042) and only one arrived. Can you help?",
    "I'm sorry to hear that. Let me look up order A-1042 for you and check the shipment.",
    "The order shipped in two parcels; the second one is due on Friday, tracking 1Z999AA1.",
    '{"order_id": "A-1042", "status": "partially_delivered", "items": [{"sku": "978-0131103627",'
    ' "qty": 1, "delivered": true}, {"sku": "978-0262033848", "qty": 1, "delivered": false}]}',
    json.dumps(_TOOL),
    "def refund(order_id: str, amount_usd: float) -> bool:\n"
    "    return api.refund(order_id, amount_usd)",
    "Thanks, that's all for today. Have a nice weekend!",
]


@pytest.mark.parametrize("text", CORPUS, ids=range(len(CORPUS)))
def test_the_char_count_over_estimates_english_and_json(fallback: None, text: str) -> None:
    n = count_text_tokens(text, "gpt-4.1")
    # at least OpenAI's ~4 chars/token for English, and not absurdly more (~2 chars/token)
    assert len(text) / 4 <= n <= len(text) / 2, (n, len(text))


def test_a_chat_request_counts_its_messages_tools_and_overhead(fallback: None) -> None:
    kw = {
        "model": "gpt-4.1",
        "messages": [
            {"role": "system", "content": CORPUS[0]},
            {"role": "user", "content": CORPUS[1]},
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "lookup_order", "arguments": '{"order_id":"A-1042"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": CORPUS[4]},
        ],
        "tools": [_TOOL],
    }
    n = prompt_tokens("gpt-4.1", request_prompt(kw))
    text_chars = sum(len(s) for s in (CORPUS[0], CORPUS[1], CORPUS[4], json.dumps(_TOOL)))
    assert n >= text_chars / 4 + 4 * 4  # the texts at ~4 chars/token, and 4 messages' overhead
    assert n <= (text_chars + 200) / 2  # (+ roles, the tool call) not absurdly more
    # each piece is counted: dropping the tools or a message lowers it
    assert prompt_tokens("gpt-4.1", request_prompt({**kw, "tools": None})) < n
    assert prompt_tokens("gpt-4.1", request_prompt({**kw, "messages": kw["messages"][:2]})) < n


def test_responses_and_anthropic_shapes_count_instructions_and_system(fallback: None) -> None:
    long = CORPUS[0] * 10
    base = prompt_tokens("gpt-4.1", request_prompt({"input": "hi"}))
    with_instr = prompt_tokens("gpt-4.1", request_prompt({"input": "hi", "instructions": long}))
    assert with_instr - base >= len(long) / 4
    blocks = [{"type": "text", "text": long, "cache_control": {"type": "ephemeral"}}]
    claude = request_prompt({"system": blocks, "messages": [{"role": "user", "content": "hi"}]})
    assert prompt_tokens("claude-sonnet-4-5", claude) - base >= len(long) / 4
    # Anthropic's tool-use preamble is counted when tools are given to a Claude model
    tools = [{"name": "t", "description": "d", "input_schema": {"type": "object"}}]
    msgs = [{"role": "user", "content": "hi"}]
    plain = prompt_tokens("claude-sonnet-4-5", request_prompt({"messages": msgs}))
    tooled = prompt_tokens("claude-sonnet-4-5", request_prompt({"messages": msgs, "tools": tools}))
    assert tooled - plain >= _estimate.CLAUDE_TOOLS_PREAMBLE_TOKENS


def test_an_image_counts_a_fixed_amount_never_its_bytes(fallback: None) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 500_000}}
    msg = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]
    n = prompt_tokens("gpt-4.1", Prompt(msg))
    assert NON_TEXT_PART_TOKENS <= n < NON_TEXT_PART_TOKENS + 50


def test_framework_messages_are_read_by_their_attributes(fallback: None) -> None:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from pydantic_ai.messages import (
        ImageUrl,
        ModelRequest,
        ModelResponse,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )

    lc = [
        HumanMessage(CORPUS[1]),
        AIMessage("", tool_calls=[{"name": "lookup_order", "args": {"q": "A-1042"}, "id": "c"}]),
        ToolMessage(CORPUS[4], tool_call_id="c"),
    ]
    assert prompt_tokens("m", Prompt(lc)) >= (len(CORPUS[1]) + len(CORPUS[4])) / 4 + 3 * 4
    pai = [
        ModelRequest(parts=[UserPromptPart([CORPUS[1], ImageUrl("https://x/y.png")])]),
        ModelResponse(parts=[ToolCallPart("lookup_order", {"order_id": "A-1042"})]),
        ModelRequest(parts=[ToolReturnPart("lookup_order", CORPUS[4])], instructions=CORPUS[0]),
    ]
    n = prompt_tokens("m", Prompt(pai))
    assert n >= NON_TEXT_PART_TOKENS + sum(len(CORPUS[i]) for i in (0, 1, 4)) / 4
    assert n < NON_TEXT_PART_TOKENS + sum(len(CORPUS[i]) for i in (0, 1, 4))  # each once


def test_cjk_text_is_not_under_counted(fallback: None) -> None:
    text = "注文番号A-1042の二冊目はまだ届いていません。返金をお願いできますか。" * 3
    cjk = sum(1 for c in text if not c.isascii())
    assert count_text_tokens(text) >= cjk  # ~1 token per CJK character, at least


def test_tiktoken_is_used_when_it_loads_and_a_failure_is_remembered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Encoding:
        def encode(self, text: str, disallowed_special: object = None) -> list[int]:
            return [0] * len(text.split())  # one token per word

    monkeypatch.setattr(_estimate, "_tiktoken_broken", False)
    monkeypatch.setattr(_estimate, "_encodings", {})
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: Encoding())
    assert count_text_tokens("one two three", "gpt-4.1") == 3
    assert count_text_tokens("one two three", "claude-sonnet-4-5") == 5  # not its tokenizer

    tries = []

    def offline(name: str) -> None:
        tries.append(name)
        raise ConnectionError("no network for the BPE file")

    monkeypatch.setattr(_estimate, "_encodings", {})
    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    assert count_text_tokens("one two three", "gpt-4o") == 5  # ceil(13 / 3.0)
    assert count_text_tokens("one two three", "gpt-4.1") == 5
    assert tries == ["o200k_base"]  # tried once, never again


# -- the output --------------------------------------------------------------------------------
def test_output_is_max_tokens_else_the_runs_largest_reply_capped_by_the_model(
    priced: SpanSink,
) -> None:
    seen = {}

    @guard.run(agent="e")
    def agent() -> None:
        run = current_run_or_none()
        seen["first"] = output_tokens(run, "gpt-4.1", None)
        seen["asked"] = output_tokens(run, "gpt-4.1", 2_000)
        with guard.step() as step:
            step.model_call(model="m", input_tokens=10, output_tokens=300)
            step.model_call(model="m", input_tokens=10, output_tokens=0)  # no usage: ignored
            step.model_call(model="m", input_tokens=10, output_tokens=9_000, error=ValueError())
        seen["seen"] = output_tokens(run, "gpt-4.1", None)
        with guard.step() as step:
            step.model_call(model="m", input_tokens=10, output_tokens=9_000)
        seen["capped"] = output_tokens(run, "gpt-3.5-turbo", None)

    agent()
    assert seen["first"] == DEFAULT_OUTPUT_TOKENS and seen["asked"] == 2_000
    assert seen["seen"] == 300  # a failed call says nothing about a reply's size
    assert seen["capped"] == 4_096
    assert model_output_limit("openai/gpt-4o-mini") == 16_384
    assert model_output_limit("claude-opus-4-1") == 32_000
    assert model_output_limit("my-local-llama") is None
