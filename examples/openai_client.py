"""The real ``openai`` client in a hand-written tool loop, guarded with one line.

``guard.instrument()`` turns on the ``openai`` integration: every model call inside the
``@guard.run`` is counted once with its usage and response id, checked for a stop before it
leaves, reserved from its ``max_tokens``, and grouped into inferred steps (one model turn plus
its tools). Run it against any OpenAI-compatible server::

    python tests/integrations/_llm_server.py &          # prints OPENAI_BASE_URL=http://127.0.0.1:PORT/v1
    OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 OPENAI_API_KEY=test python examples/openai_client.py

(the test server's model keeps rephrasing a search that never finds anything: the run stops
with ``loop_detected``). Set ``OTEL_GUARD_ENDPOINT=127.0.0.1:4317`` to report to a guard.
"""

from __future__ import annotations

import json

import openai

import guard

guard.instrument()

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search_orders",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
]


@guard.tool  # a tool your own loop runs: recorded, fingerprinted (never exported raw)
def search_orders(query: str) -> str:
    return "no orders found"


@guard.run(agent="support-bot", max_steps=20, max_tokens=20_000)
def answer(question: str) -> str:
    client = openai.OpenAI()  # OPENAI_BASE_URL / OPENAI_API_KEY from the environment
    messages: list[dict] = [{"role": "user", "content": question}]
    while True:
        reply = client.chat.completions.create(
            model="gpt-4.1-mini", messages=messages, tools=TOOLS, max_tokens=500
        )
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content or ""
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = search_orders(**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})


if __name__ == "__main__":
    try:
        print("answer:", answer("Where is order 9?"))
    except guard.RunStopped as stop:
        o = stop.outcome
        print(
            f"{o.status} {o.reason} after {o.model_calls} model calls, "
            f"{o.input_tokens}+{o.output_tokens} tokens: {o.message}"
        )
