"""The integrations reserve the whole request before it leaves (its prompt counted from the
request, its output: max tokens, else the run's largest reply so far), priced at the model's
input and output rates: a run's cost budget is not overshot by calls whose estimate cannot be
covered. Real ``openai`` / ``anthropic`` clients against the scripted local server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from _llm_server import LLMServer, text

import guard
from guard.integrations._estimate import prompt_tokens, request_prompt
from guard.policy import ModelPrice, PriceBook
from guard.sdk._run import current_run_or_none
from guard.testing import SpanSink, capture_spans

GPT, CLAUDE = "gpt-4.1", "claude-sonnet-4-5"
BOOK = PriceBook("test", {GPT: ModelPrice(6.0, 20.0), CLAUDE: ModelPrice(6.0, 20.0)})
CALL_USD = (1000 * 6 + 200 * 20) / 1e6  # one call of 1000 in + 200 out: $0.01
N = 5  # the calls that fit the budget below; a sixth would pass it
MAX_COST_USD = N * CALL_USD + 0.005  # room for 5 calls and the old estimate of a sixth
# A support conversation of ~4,300 characters: ~1,000-1,500 tokens by either count.
PROMPT = "".join(
    f"Order A-{1000 + i}: the customer asks for a refund of ${10 + i}.99, the parcel came late. "
    for i in range(50)
)
SYSTEM = "You are a support agent. Answer in one sentence."

# (api, the request's output bound, if any)
CASES = [
    ("chat", None),
    ("chat", 200),
    ("responses", None),
    ("responses", 200),
    ("anthropic", 200),  # Anthropic requires max_tokens
]


@pytest.fixture
def priced() -> Iterator[SpanSink]:
    with capture_spans(hmac_key=b"test-key-0123456789", price_book=BOOK) as s:
        yield s


def _request(api: str, max_tokens: int | None) -> dict[str, Any]:
    if api == "chat":
        kw: dict[str, Any] = {"model": GPT, "messages": [{"role": "system", "content": SYSTEM}]}
        kw["messages"].append({"role": "user", "content": PROMPT})
        bound = "max_completion_tokens"
    elif api == "responses":
        kw, bound = {"model": GPT, "instructions": SYSTEM, "input": PROMPT}, "max_output_tokens"
    else:
        kw = {"model": CLAUDE, "system": SYSTEM, "messages": [{"role": "user", "content": PROMPT}]}
        bound = "max_tokens"
    if max_tokens is not None:
        kw[bound] = max_tokens
    return kw


def _call(llm: LLMServer, api: str, kw: dict[str, Any]) -> Any:
    if api == "anthropic":
        client = anthropic.Anthropic(base_url=llm.anthropic_base_url, api_key="t", max_retries=0)
        return client.messages.create(**kw)
    client = openai.OpenAI(base_url=llm.base_url, api_key="test", max_retries=0)
    if api == "chat":
        return client.chat.completions.create(**kw)
    return client.responses.create(**kw)


@pytest.mark.parametrize(("api", "max_tokens"), CASES, ids=[f"{a}-{m}" for a, m in CASES])
def test_a_call_whose_whole_estimate_cannot_be_covered_never_leaves(
    priced: SpanSink, llm: LLMServer, api: str, max_tokens: int | None
) -> None:
    guard.instrument("openai", "anthropic")
    llm.script = [text("Your refund is on its way.", input=1000, output=200)]
    kw = _request(api, max_tokens)
    estimate = prompt_tokens(kw["model"], request_prompt(kw))
    assert 1000 <= estimate <= 1800, estimate  # the scenario: ~1,000 prompt tokens or more
    held: list[tuple[float, int]] = []

    @guard.run(agent="estimating", max_cost_usd=MAX_COST_USD, max_steps=100)
    def agent() -> None:
        run = current_run_or_none()
        while True:
            _call(llm, api, kw)
            r = run.budget.reserved()  # each estimate settled by its call: nothing left held
            held.append((r.cost_usd, r.tokens))

    with pytest.raises(guard.RunStopped) as stop:
        agent()
    o = stop.value.outcome
    # Only a whole-request estimate stops it before the sixth call: reserving the max tokens
    # alone at one rate (0.004) or nothing without max tokens would let it go, over the budget.
    assert (o.reason, o.decided_by) == ("cost_budget", "sdk"), o.message
    assert "reservation refused" in o.message, o.message
    assert llm.count == o.model_calls == N
    assert o.cost_usd == pytest.approx(N * CALL_USD) and o.cost_usd <= MAX_COST_USD
    assert held == [(pytest.approx(0.0), 0)] * N  # estimate > actual: the rest released


def test_an_async_call_without_max_tokens_reserves_its_prompt_and_the_runs_replies(
    priced: SpanSink, llm: LLMServer
) -> None:
    guard.instrument("openai")
    llm.script = [text("ok", input=1000, output=200)]
    client = openai.AsyncOpenAI(base_url=llm.base_url, api_key="test", max_retries=0)
    kw = _request("chat", None)
    estimate = prompt_tokens(GPT, request_prompt(kw))
    seen: list[tuple[float, int]] = []

    @guard.run(agent="estimating-async", max_cost_usd=10.0)
    async def agent() -> None:
        run = current_run_or_none()
        for _ in range(2):
            gate = llm.hold()  # the server holds the request: the reservation is in flight
            with gate.held():
                task = asyncio.ensure_future(client.chat.completions.create(**kw))
                assert await asyncio.to_thread(gate.arrived.wait, 10)
                r = run.budget.reserved()
                seen.append((r.cost_usd, r.tokens))
            await task

    asyncio.run(agent())
    first, second = seen
    # the first call: the default reply (512); the second: the run's largest reply so far (200)
    assert first[1] == estimate + 512
    assert first[0] == pytest.approx((estimate * 6 + 512 * 20) / 1e6)
    assert second[1] == estimate + 200
    assert second[0] == pytest.approx((estimate * 6 + 200 * 20) / 1e6)
