"""A plain asyncio tool loop, guarded by the otel-guard decorator.

Run it:  python examples/async_tool_loop.py                  # local-only: no guard needed
         python examples/async_tool_loop.py --endpoint 127.0.0.1:4317   # with `otel-guard serve`

Two runs of the same little agent. The first gets a clear forecast and answers. The second
gets an ambiguous forecast and keeps asking the same question: the SDK sees the repeated
action (same tool, same arguments, same result) and stops the run with ``loop_detected``
instead of letting it spin until someone notices the bill.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import guard

FORECASTS = {
    "Hangzhou": {"rain_probability": 0.8, "summary": "showers in the afternoon"},
    "Atlantis": {"rain_probability": None, "summary": "forecast unavailable"},
}


@guard.tool
async def get_forecast(city: str) -> dict:
    """The tool: a (fake) weather service with a little latency."""
    await asyncio.sleep(0.02)
    return FORECASTS.get(city, {"rain_probability": None, "summary": "unknown city"})


@guard.run(agent="umbrella-advisor", max_steps=10, max_tool_calls=20, deadline_s=30)
async def advise(city: str) -> str:
    """Decide whether to bring an umbrella. Naive on purpose: retries until it gets a number."""
    context_tokens = 400
    while True:
        with guard.step() as step:
            # A real agent would call its model here; we report the usage it would have had.
            context_tokens += 150
            step.model_call(model="gpt-4.1-mini", input_tokens=context_tokens, output_tokens=40)
            forecast = await get_forecast(city)
            chance = forecast["rain_probability"]
            if chance is not None:
                step.progress(True)
                verdict = "bring an umbrella" if chance >= 0.5 else "leave the umbrella home"
                return f"{city}: {forecast['summary']} ({chance:.0%} rain), {verdict}"
            # No number yet: the agent "thinks" the next try will be different. It will not.


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", default=None, help="guard HOST:PORT (default: local-only)")
    parser.add_argument("--tenant", default="examples")
    args = parser.parse_args()
    guard.configure(endpoint=args.endpoint, tenant=args.tenant)
    print(f"mode: {'guard at ' + args.endpoint if args.endpoint else 'local-only'}")

    failures = 0
    for city, expected in (("Hangzhou", "final_answer"), ("Atlantis", "loop_detected")):
        try:
            answer = await advise(city)
            status, reason = "completed", "final_answer"
            print(f"{city}: completed final_answer -> {answer}")
        except guard.RunStopped as stopped:
            o = stopped.outcome
            status, reason = str(o.status), str(o.reason)
            print(
                f"{city}: {status} {reason} after {o.steps} steps, {o.tool_calls} tool calls"
                f" (last tool {o.last_tool}) -> {o.message}"
            )
        if reason != expected:
            failures += 1
            print(f"  unexpected: wanted {expected}, got {status}/{reason}", file=sys.stderr)
    guard.shutdown()  # deliver the last spans and run records before the process exits
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
