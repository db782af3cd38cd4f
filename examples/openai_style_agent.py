"""An OpenAI-style tool-calling loop, guarded by otel-guard, driven by a scripted fake model.

Run it:  python examples/openai_style_agent.py               # offline, local-only
         python examples/openai_style_agent.py --endpoint 127.0.0.1:4317

The loop is the one every chat-completions agent has: send ``messages`` with the tool schemas,
read ``choices[0].message``; when it has ``tool_calls``, run each tool with its JSON
``arguments``, append the results as ``role: tool`` messages, and go round again; when it has
none, its ``content`` is the answer. ``FakeChatCompletions`` returns objects shaped like the
OpenAI SDK's, from a script, so the example runs without a network or a key. Swap it for
``openai.OpenAI().chat.completions`` and nothing else changes.

Two conversations: one the model resolves in three rounds, and one where it keeps rephrasing
an order search that always comes back empty. The second is the classic "varying arguments,
same empty result" loop; the SDK stops it with ``loop_detected``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any

import guard

# ------------------------------------------------------------------ an OpenAI-shaped fake


@dataclass
class Function:
    name: str
    arguments: str  # JSON text, as the API returns it


@dataclass
class ToolCall:
    id: str
    function: Function
    type: str = "function"


@dataclass
class Message:
    role: str
    content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclass
class Choice:
    message: Message
    finish_reason: str


@dataclass
class ChatCompletion:
    id: str
    model: str
    choices: list[Choice]
    usage: Usage


class FakeChatCompletions:
    """``client.chat.completions.create(...)`` from a script of replies (no network)."""

    def __init__(self, script: list[Message]) -> None:
        self.script = script
        self.calls = 0

    def create(self, *, model: str, messages: list[dict], tools: list[dict]) -> ChatCompletion:
        reply = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        # Usage like a real API: the prompt is the whole history, so it grows every round.
        prompt_tokens = 200 + sum(len(json.dumps(m, default=str)) // 4 for m in messages)
        completion_tokens = 30 + 10 * len(reply.tool_calls)
        # A looping model rephrases its query each round: give each reply its own arguments.
        calls = [
            ToolCall(f"call_{self.calls}_{i}", Function(tc.function.name, tc.function.arguments))
            for i, tc in enumerate(reply.tool_calls)
        ]
        if calls and reply.content == "rephrase":
            args = json.loads(calls[0].function.arguments)
            args["query"] = f"{args['query']} (attempt {self.calls})"
            calls[0].function.arguments = json.dumps(args)
        message = Message("assistant", None if calls else reply.content, calls)
        finish = "tool_calls" if calls else "stop"
        return ChatCompletion(
            id=f"chatcmpl-{self.calls}",
            model=model,
            choices=[Choice(message, finish)],
            usage=Usage(prompt_tokens, completion_tokens),
        )


def _call(name: str, **arguments: Any) -> ToolCall:
    return ToolCall("", Function(name, json.dumps(arguments)))


HAPPY = [
    Message("assistant", tool_calls=[_call("lookup_order", query="order 1234")]),
    Message("assistant", tool_calls=[_call("refund_status", order_id="1234")]),
    Message("assistant", "Your refund for order 1234 was issued on Monday; allow 3-5 days."),
]
LOOPING = [Message("assistant", "rephrase", tool_calls=[_call("lookup_order", query="order 9")])]

# ------------------------------------------------------------------------------ the tools

ORDERS = {"1234": {"order_id": "1234", "status": "refunded"}}
TOOL_SCHEMAS = [
    {"type": "function", "function": {"name": "lookup_order", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "refund_status", "parameters": {"type": "object"}}},
]


@guard.tool
def lookup_order(query: str) -> list[dict]:
    return [o for oid, o in ORDERS.items() if oid in query.split()]


@guard.tool
def refund_status(order_id: str) -> dict:
    return {"order_id": order_id, "refund": "issued", "issued_on": "Monday"}


TOOLS = {"lookup_order": lookup_order, "refund_status": refund_status}

# ------------------------------------------------------------------------------ the agent


@guard.run(agent="refund-bot", max_steps=12, max_tool_calls=30, max_cost_usd=0.50)
def answer(client: FakeChatCompletions, question: str) -> str:
    messages: list[dict] = [
        {"role": "system", "content": "You help customers with refunds."},
        {"role": "user", "content": question},
    ]
    while True:
        with guard.step() as step:
            resp = client.create(model="gpt-4.1-mini", messages=messages, tools=TOOL_SCHEMAS)
            step.model_call(
                model=resp.model,
                input_tokens=resp.usage.prompt_tokens,
                output_tokens=resp.usage.completion_tokens,
            )
            msg = resp.choices[0].message
            messages.append({"role": "assistant", "content": msg.content,
                             "tool_calls": [tc.id for tc in msg.tool_calls]})  # fmt: skip
            if not msg.tool_calls:
                return msg.content or ""
            for tc in msg.tool_calls:
                result = TOOLS[tc.function.name](**json.loads(tc.function.arguments))
                messages.append(
                    {"role": "tool", "tool_call_id": tc.id, "content": json.dumps(result)}
                )
                step.progress(bool(result))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", default=None, help="guard HOST:PORT (default: local-only)")
    parser.add_argument("--tenant", default="examples")
    args = parser.parse_args()
    guard.configure(endpoint=args.endpoint, tenant=args.tenant)
    print(f"mode: {'guard at ' + args.endpoint if args.endpoint else 'local-only'}")

    failures = 0
    cases = (
        ("Where is my refund for order 1234?", HAPPY, "final_answer"),
        ("Where is order 9?", LOOPING, "loop_detected"),
    )
    for question, script, expected in cases:
        client = FakeChatCompletions(script)
        try:
            reply = answer(client, question)
            reason = "final_answer"
            print(f"{question!r}: completed final_answer after {client.calls} rounds -> {reply}")
        except guard.RunStopped as stopped:
            o = stopped.outcome
            reason = str(o.reason)
            print(
                f"{question!r}: {o.status} {o.reason} after {o.steps} steps, "
                f"{o.tool_calls} tool calls, {o.input_tokens + o.output_tokens} tokens -> "
                f"{o.message}"
            )
        if reason != expected:
            failures += 1
            print(f"  unexpected: wanted {expected}, got {reason}", file=sys.stderr)
    guard.shutdown()  # deliver the last spans and run records before the process exits
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
