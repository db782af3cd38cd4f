"""A scripted chat model and offline tools for the demo fleet.

Nothing here touches the network. The model returns usage numbers shaped like a real chat
completion: the prompt resends the whole history, so round ``n`` costs about
``B + (n-1)·D`` input tokens and a run's total grows with the square of its length. Prices are
USD per 1M tokens and match the demo's price book, so the cost the agents report is the cost
the guard would compute.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import KW_ONLY, dataclass, field

__all__ = ["DEMO_PRICES", "ModelReply", "ScriptedModel"]

# USD per 1M tokens (input, output); the demo policy publishes the same book to the guard.
DEMO_PRICES: dict[str, tuple[float, float]] = {
    "gpt-4.1": (2.0, 8.0),
    "gpt-4.1-mini": (0.4, 1.6),
    "o3": (10.0, 40.0),
}


@dataclass(frozen=True, slots=True)
class ModelReply:
    """One scripted completion: the usage a provider would report, and its price."""

    model: str
    input_tokens: int
    output_tokens: int
    cost_usd: float
    text: str


@dataclass
class ScriptedModel:
    """Deterministic fake model: growing context, scripted output size, simulated latency.

    ``base_tokens`` is the first prompt (system + task); every round appends ``delta_tokens``
    of history (the previous answer and tool results), which is what makes long runs burn
    tokens quadratically. ``seed`` seeds the latency jitter and the output sizes.
    """

    model: str = "gpt-4.1-mini"
    _: KW_ONLY
    base_tokens: int = 900
    delta_tokens: int = 250
    output_tokens: int = 120
    latency_s: float = 0.05
    seed: int | None = None
    rounds: int = field(default=0, init=False)
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def price(self, input_tokens: int, output_tokens: int) -> float:
        usd_in, usd_out = DEMO_PRICES.get(self.model, (1.0, 4.0))
        return (input_tokens * usd_in + output_tokens * usd_out) / 1_000_000

    async def complete(self, prompt: str) -> ModelReply:
        """Answer one round. The prompt text is only used for the reply, never measured."""
        self.rounds += 1
        jitter = self._rng.uniform(0.7, 1.3) if self.latency_s else 1.0
        await asyncio.sleep(self.latency_s * jitter)
        input_tokens = self.base_tokens + (self.rounds - 1) * self.delta_tokens
        output_tokens = max(1, int(self.output_tokens * self._rng.uniform(0.8, 1.2)))
        return ModelReply(
            model=self.model,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cost_usd=self.price(input_tokens, output_tokens),
            text=f"round {self.rounds}: {prompt[:40]}",
        )
