"""A Pydantic AI agent guarded with one line: ``guard.instrument()``, plus ``@guard.run``.

``guard.instrument()`` turns on the ``pydantic_ai`` integration (and ``openai``, which the
agent's OpenAI model calls): every model request inside the run is counted once with its usage
and response id, checked for a stop and reserved from its ``max_tokens`` before it leaves; every
tool call is fingerprinted in-process and fed to loop detection; one model turn plus its tools is
a step. A stop comes out of ``agent.run_sync`` as ``guard.RunStopped``, and the tool result that
triggered it never reaches the model. Without ``@guard.run`` each ``agent.run`` would be a run
of its own, named after the agent. Run it against any OpenAI-compatible server::

    python tests/integrations/_llm_server.py &          # prints OPENAI_BASE_URL=http://127.0.0.1:PORT/v1
    OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 OPENAI_API_KEY=test python examples/pydantic_ai_agent.py

(the test server's model keeps rephrasing a search that never finds anything: the run stops
with ``loop_detected``). Set ``OTEL_GUARD_ENDPOINT=127.0.0.1:4317`` to report to a guard.
"""

from __future__ import annotations

from pydantic_ai import Agent

import guard

guard.instrument()

# OPENAI_BASE_URL / OPENAI_API_KEY from the environment; the chat completions API.
agent = Agent(
    "openai-chat:gpt-4.1-mini",
    name="support-bot",
    instructions="Find the customer's order with the search_orders tool.",
    model_settings={"max_tokens": 500},
)


@agent.tool_plain
def search_orders(query: str) -> str:
    """Search the order database."""
    return "no orders found"


@guard.run(agent="support-bot", max_steps=20, max_tokens=20_000)
def answer(question: str) -> str:
    return agent.run_sync(question).output


if __name__ == "__main__":
    try:
        print("answer:", answer("Where is order 9?"))
    except guard.RunStopped as stop:
        o = stop.outcome
        print(
            f"{o.status} {o.reason} after {o.model_calls} model calls, "
            f"{o.input_tokens}+{o.output_tokens} tokens: {o.message}"
        )
