"""The simulated agents of the demo fleet, written exactly as a user would write them.

Each scenario is an ordinary asyncio agent loop instrumented with the public API only:
``@guard.run`` around the run, ``guard.step()`` around each iteration, ``step.model_call`` for
the (scripted) model's usage, ``@guard.tool`` on the tools and ``step.progress`` for progress.
The runaway ones misbehave the way real agents do: they never stop, oscillate between two
actions, rephrase into the same empty result, go nowhere, resend an ever-growing context, burn
an expensive model, wait on a slow upstream or spend their tenant's shared budget; nothing in
them knows how it will be stopped: the SDK and the guard decide that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import guard
from guard.demo._model import ScriptedModel

__all__ = ["SCENARIOS", "Scenario"]


# ------------------------------------------------------------------------------------ tools


@guard.tool
async def kb_search(q: str) -> list[str]:
    """Knowledge-base search: distinct queries give distinct hits."""
    await asyncio.sleep(0.01)
    return [f"doc:{abs(hash(q)) % 997}", f"doc:{len(q)}"]


@guard.tool
async def search_orders(q: str) -> list[str]:
    """Order search that finds nothing, however the query is phrased."""
    await asyncio.sleep(0.01)
    return []


@guard.tool
async def run_tests(target: str) -> str:
    await asyncio.sleep(0.01)
    return "1 failed: test_refund_rounding"


@guard.tool
async def edit_file(path: str, patch: str) -> str:
    await asyncio.sleep(0.01)
    return "applied"


@guard.tool
async def browse(url: str) -> str:
    """A different page every time: the actions vary, the task does not advance."""
    await asyncio.sleep(0.01)
    return f"<html>{url}</html>"


@guard.tool
async def fetch_ledger(quarter: str) -> str:
    """A slow upstream (0.6 s per call): the run's deadline arrives before the work is done."""
    await asyncio.sleep(0.6)
    return f"ledger {quarter}: 1204 rows"


@guard.tool
async def draft(section: str) -> str:
    await asyncio.sleep(0.01)
    return f"draft of {section}"


def _record(step: Any, reply: Any, cost_usd: float | None = None) -> None:
    """The reply's usage, at its own price unless ``cost_usd`` says otherwise."""
    step.model_call(
        model=reply.model,
        input_tokens=reply.input_tokens,
        output_tokens=reply.output_tokens,
        cost_usd=reply.cost_usd if cost_usd is None else cost_usd,
    )


async def _keep_producing(
    model: ScriptedModel,
    prompt: str,
    tool: Callable[[str], Awaitable[Any]],
    arg: str,
    fact: str,
    *,
    cost_usd: float | None = None,
) -> NoReturn:
    """The loop of a runaway that never runs dry: round ``i`` (from 1) asks the model
    ``prompt``, calls ``tool(arg)`` and reports the new ``fact``, each formatted with ``i``."""
    i = 0
    while True:
        i += 1
        with guard.step() as step:
            _record(step, await model.complete(prompt.format(i=i)), cost_usd)
            await tool(arg.format(i=i))
            step.progress(facts=[fact.format(i=i)])


# -------------------------------------------------------------------------------- agents


async def healthy(n: int, *, steps: int = 3, pause_s: float = 0.15) -> str:
    """A well-behaved agent: a few rounds with progress, then a final answer."""
    model = ScriptedModel("gpt-4.1-mini", seed=n, latency_s=pause_s)
    for i in range(steps):
        with guard.step() as step:
            _record(step, await model.complete(f"ticket {n} round {i}"))
            hits = await kb_search(f"ticket {n} topic {i}")
            step.progress(facts=[f"evidence:{h}" for h in hits])
    return f"answer for ticket {n}"


async def never_stops(n: int) -> str:
    """Keeps exploring, each step new and 'useful': only max_steps ends it."""
    model = ScriptedModel("gpt-4.1-mini", seed=n, latency_s=0.04)
    await _keep_producing(
        model, "plan more {i}", kb_search, "angle {i} of the market study", "angle:{i}"
    )


async def ab_oscillation(n: int) -> str:
    """run tests -> edit -> run tests -> edit ... with the same arguments and results."""
    model = ScriptedModel("gpt-4.1", seed=n, latency_s=0.04)
    while True:
        with guard.step() as step:
            _record(step, await model.complete("fix the failing test"))
            await run_tests("tests/test_refunds.py")
        with guard.step() as step:
            _record(step, await model.complete("patch it"))
            await edit_file("refunds.py", "round(x, 2)")


async def same_empty_result(n: int) -> str:
    """The same tool with slightly different arguments, always the same empty result."""
    model = ScriptedModel("gpt-4.1-mini", seed=n, latency_s=0.04)
    phrasings = ["order 1234", "Order #1234", "orders for customer 1234", "1234 order", "#1234"]
    i = 0
    while True:
        with guard.step() as step:
            _record(step, await model.complete("find the order"))
            await search_orders(phrasings[i % len(phrasings)] + f" v{i}")
        i += 1


async def stagnation(n: int) -> str:
    """Varied actions, varied results, and the state of the task never changes."""
    model = ScriptedModel("gpt-4.1-mini", seed=n, latency_s=0.04)
    i = 0
    while True:
        i += 1
        with guard.step() as step:
            _record(step, await model.complete("research competitors"))
            await browse(f"https://example.com/page/{i}")
            step.progress(False)


async def token_burner(n: int) -> str:
    """Resends the whole growing history each round: input tokens grow quadratically."""
    model = ScriptedModel("gpt-4.1", seed=n, base_tokens=2_000, delta_tokens=1_500, latency_s=0.08)
    await _keep_producing(
        model, "summarise the whole thread again", draft, "section {i}", "sections:{i}"
    )


async def cost_burner(n: int) -> str:
    """An expensive reasoning model with long outputs: dollars, not tokens, run out first."""
    model = ScriptedModel("o3", seed=n, base_tokens=4_000, delta_tokens=200, output_tokens=1_500)
    await _keep_producing(model, "think harder", draft, "proof attempt {i}", "attempt:{i}")


async def slow_tool(n: int) -> str:
    """Waits on a slow upstream; the deadline arrives first."""
    model = ScriptedModel("gpt-4.1-mini", seed=n, latency_s=0.02)
    for q in ("Q1", "Q2", "Q3", "Q4", "Q1-restated", "Q2-restated"):
        with guard.step() as step:
            _record(step, await model.complete(f"reconcile {q}"))
            await fetch_ledger(q)
            step.progress(facts=[f"quarter:{q}"])
    return "reconciled"


async def budget_spender(n: int, *, cost_per_step_usd: float = 0.04) -> str:
    """A batch job that spends steadily: the tenant's hourly budget stops it, not its own."""
    model = ScriptedModel("gpt-4.1", seed=n, latency_s=0.2)
    await _keep_producing(
        model,
        "enrich record batch {i}",
        kb_search,
        f"batch {n} record {{i}}",
        "records:{i}",
        cost_usd=cost_per_step_usd,
    )


async def long_support(n: int, *, max_rounds: int = 400) -> str:
    """A long, healthy conversation: it is still running when the operator cancels."""
    model = ScriptedModel("gpt-4.1-mini", seed=n, delta_tokens=40, latency_s=0.4)
    for i in range(max_rounds):
        with guard.step() as step:
            _record(step, await model.complete(f"customer {n} message {i}"))
            await kb_search(f"customer {n} question {i}")
            step.progress(facts=[f"message:{i}"])
    return "conversation closed"


@dataclass(frozen=True, slots=True)
class Scenario:
    """One kind of simulated agent: its loop, its agent name, the limits it asks for and
    the stop reason the demo stages with it."""

    kind: str
    agent: str
    fn: Callable[..., Awaitable[str]]
    expect: str
    limits: dict[str, Any]


SCENARIOS: dict[str, Scenario] = {
    s.kind: s
    for s in (
        Scenario("healthy", "support-bot", healthy, "final_answer", {"max_steps": 12}),
        Scenario("never_stops", "market-researcher", never_stops, "max_steps", {"max_steps": 10}),
        Scenario("ab_oscillation", "code-fixer", ab_oscillation, "loop_detected", {}),
        Scenario("same_empty_result", "order-lookup", same_empty_result, "loop_detected", {}),
        Scenario("stagnation", "web-researcher", stagnation, "no_progress", {}),
        Scenario(
            "token_burner",
            "thread-summariser",
            token_burner,
            "token_budget",
            {"max_tokens": 60_000},
        ),
        Scenario(
            "cost_burner", "proof-assistant", cost_burner, "cost_budget", {"max_cost_usd": 0.40}
        ),
        Scenario("slow_tool", "ledger-reconciler", slow_tool, "deadline", {"deadline_s": 1.5}),
        Scenario(
            "budget_spender",
            "batch-enricher",
            budget_spender,
            "tenant_budget",
            {"max_cost_usd": 5.0, "max_steps": 400},
        ),
        Scenario("budget_denied", "batch-enricher", healthy, "tenant_budget", {"max_steps": 12}),
        Scenario(
            "long_support",
            "live-chat",
            long_support,
            "operator_cancel",
            {"deadline_s": 40.0, "max_steps": 500},
        ),
    )
}
