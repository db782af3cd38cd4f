"""The real ``anthropic`` client in a hand-written tool loop, guarded with one line.

``guard.instrument()`` turns on the ``anthropic`` integration: every Messages call inside the
``@guard.run`` is counted once with its usage (cache reads and writes included in the input
tokens) and response id, checked for a stop before it leaves, reserved from its
``max_tokens``, and grouped into inferred steps (one model turn plus its tools). The tools the
loop runs are read back from the ``tool_use`` / ``tool_result`` blocks it sends, so a plain
function needs no ``@guard.tool``. Run it against the local test server::

    python tests/integrations/_llm_server.py &          # prints ANTHROPIC_BASE_URL=http://127.0.0.1:PORT
    ANTHROPIC_BASE_URL=http://127.0.0.1:PORT ANTHROPIC_API_KEY=test python examples/anthropic_client.py

(the test server's model keeps rephrasing a search that never finds anything: the run stops
with ``loop_detected``). Set ``OTEL_GUARD_ENDPOINT=127.0.0.1:4317`` to report to a guard.
"""

from __future__ import annotations

import anthropic

import guard

guard.instrument()

TOOLS = [
    {
        "name": "search_orders",
        "description": "Search the orders by a free-text query.",
        "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}},
    }
]


def search_orders(query: str) -> str:  # a plain function: read back from the conversation
    return "no orders found"


@guard.run(agent="support-bot", max_steps=20, max_tokens=20_000)
def answer(question: str) -> str:
    client = anthropic.Anthropic()  # ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY from the environment
    messages: list[dict] = [{"role": "user", "content": question}]
    while True:
        reply = client.messages.create(
            model="claude-sonnet-4-5", max_tokens=500, messages=messages, tools=TOOLS
        )
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            return "".join(b.text for b in reply.content if b.type == "text")
        messages.append({"role": "assistant", "content": reply.content})
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": b.id,
                        "content": search_orders(**b.input),
                    }
                    for b in uses
                ],
            }
        )


if __name__ == "__main__":
    try:
        print("answer:", answer("Where is order 9?"))
    except guard.RunStopped as stop:
        o = stop.outcome
        print(
            f"{o.status} {o.reason} after {o.model_calls} model calls, "
            f"{o.input_tokens}+{o.output_tokens} tokens: {o.message}"
        )
