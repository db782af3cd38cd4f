"""An OpenAI Agents SDK agent guarded with one line: ``guard.instrument()`` plus ``@guard.run``.

Runs against any OpenAI-compatible server named by ``OPENAI_BASE_URL`` (and ``OPENAI_API_KEY``);
for a local one, e.g. the scripted test server::

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=local \\
    OPENAI_AGENTS_DISABLE_TRACING=1 python examples/openai_agents_agent.py

(``OPENAI_AGENTS_DISABLE_TRACING=1`` keeps the library's own trace upload off; otel-guard's
spans go to ``OTEL_GUARD_ENDPOINT`` or stay local.) Every model call is counted with its
usage, each tool call feeds loop detection, a step is inferred per model turn, and a stop
(a loop, a budget, an operator's cancel) raises ``guard.RunStopped`` out of ``Runner.run_sync``.
"""

from __future__ import annotations

from agents import Agent, Runner, function_tool

import guard

guard.instrument()


@function_tool
def lookup_policy(topic: str) -> str:
    """Look up a company policy by topic."""
    return "Refunds are accepted within 30 days of purchase with a receipt."


agent = Agent(
    name="refund-bot",
    instructions="Answer the customer's question; look policies up when needed.",
    tools=[lookup_policy],
)


@guard.run(agent="refund-bot", max_steps=12, max_tokens=60_000, max_cost_usd=0.50)
def handle(question: str) -> str:
    return Runner.run_sync(agent, question).final_output


if __name__ == "__main__":
    try:
        print(handle("Can I get a refund for shoes I bought three weeks ago?"))
    except guard.RunStopped as stop:
        print(f"stopped: {stop.outcome.reason} ({stop.outcome.message})")
