"""Where a guarded step's time goes: the step of ``bench_sdk_overhead.py`` under cProfile.

Splits the profiled time per step into OpenTelemetry (the spans, the same on both sides of the
overhead benchmark), the policy (``guard/policy``), the SDK's own glue (``guard/sdk``) and the
rest (builtins called from all of them), and lists the heaviest SDK and policy functions by
their own time. cProfile inflates small functions, so read the shares, not the microseconds.

``--shares``: no profiler; what each part adds to the plain step, timed in context (thread CPU
time, interleaved rounds, like the overhead benchmark): OpenTelemetry inside a guarded run
(the relay processor), the policy calls the SDK makes (made by hand), the SDK's own glue.

    .venv/bin/python benchmarks/profile_sdk_step.py [--steps 10000] [--top 15]
    .venv/bin/python benchmarks/profile_sdk_step.py --shares [--steps 2000] [--rounds 9]

``--pure-python``: the policy's pure-Python reference instead of the native fast paths.

Prints JSON.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
from typing import Any

import bench_sdk_overhead as bench  # the same step and spans (run from benchmarks/' parent)
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

import guard
from guard.policy import native_available, use_native
from guard.sdk._api import reset


def _part(filename: str) -> str:
    if "opentelemetry" in filename:
        return "otel"
    if "/guard/policy/" in filename:
        return "policy"
    if "/guard/sdk/" in filename or "/guard/semconv" in filename:
        return "sdk"
    return "other"


def inline_steps(n: int, base: int, policy: bool) -> float:
    """The guarded step's spans (same names, attributes and nesting) emitted by hand inside a
    guarded run, under the relay the SDK puts on the provider; with ``policy``, also every
    policy call the SDK makes per step (the same calls, arguments and decisions applied), but
    none of the SDK's own code around them. What ``guarded_steps`` costs above this is the
    SDK's glue; what this costs above the plain side is OpenTelemetry in the guard's context
    (``policy=False``) and the policy itself."""

    @guard.run(agent="bench", max_steps=n + 10, max_tokens=10**12, max_tool_calls=n + 10)
    def agent() -> float:
        run = guard.current_run()
        budget, fp, detector, rt, soft = run.budget, run.fp, run.detector, run.rt, run.soft
        tracer, rid, tenant, book = rt.tracer, run.run_id, run.tenant, rt.price_book
        fp_a, fp_r = "a" * 32, "b" * 32
        t0 = bench._clock()
        for i in range(n):
            if policy and not budget.step_if_no_escalation(soft.rank):
                run.check()  # what begin_step does when something could fire
                budget.record_step()
            step = tracer.start_span(
                "guard.step",
                context=run.ctx,
                attributes={"guard.run.id": rid, "guard.tenant": tenant, "guard.step.index": i + 1},
            )
            ctx = trace.set_span_in_context(step)
            token = otel_context.attach(ctx)
            inp = 1200 + i
            cost = book.cost_usd("gpt-4.1", input_tokens=inp, output_tokens=90, cached_tokens=0)
            args = {"q": f"refund {base + i}", "lang": "en"}
            if policy:  # the calls of model_call and tool_call (their spans go out below)
                _, d_model = budget.model_call_escalation(inp, 90, 0, 0, cost, soft.rank, None)
                fp_a, fp_r = fp.action("search", args), fp.result(i)
                detector.observe_action(fp_a, fp_r)
                _, d_tool = budget.tool_call_escalation(1, None, None, soft.rank)
                for d in (d_model, d_tool):
                    if d is not None:
                        run.apply(d, raise_now=False)
            model = {
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "gpt-4.1",
                "gen_ai.usage.input_tokens": inp,
                "gen_ai.usage.output_tokens": 90,
                "gen_ai.usage.cache_read.input_tokens": 0,
                "gen_ai.usage.reasoning.output_tokens": 0,
                "guard.run.id": rid,
                "gen_ai.provider.name": "openai",
                "guard.cost.usd": cost,
            }
            tool = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "search",
                "guard.action.fingerprint": fp_a,
                "guard.tool.attempts": 1,
                "guard.run.id": rid,
                "guard.result.hash": fp_r,
            }
            for name, kind, attrs in (
                ("chat gpt-4.1", SpanKind.CLIENT, model),
                ("execute_tool search", SpanKind.INTERNAL, tool),
            ):
                tracer.start_span(name, context=ctx, kind=kind, attributes=attrs).end()
            if policy:
                detector.end_step(state=None, progress=True, acted=True)
            step.set_attributes({"guard.progress": True, "guard.action.fingerprint": fp_a})
            step.end()
            otel_context.detach(token)
        return bench._clock() - t0

    return agent()


def shares(steps: int, rounds: int) -> dict[str, Any]:
    """Where the guarded step's overhead goes, measured in context (each part with the rest
    of the step around it, as in ``bench_sdk_overhead``; a part timed alone misses the cache
    and branch misses the rest of the step causes). Interleaved rounds, ratios to the plain
    side of the same round, medians."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(bench.NullExporter()))
    plain_provider = TracerProvider()
    plain_provider.add_span_processor(SimpleSpanProcessor(bench.NullExporter()))
    plain = plain_provider.get_tracer("bench")
    guard.configure(tracer_provider=provider, hmac_key=b"bench-key-0123456789")
    sides = {
        "spans_in_run": lambda r: inline_steps(steps, r * steps, policy=False),
        "spans_and_policy": lambda r: inline_steps(steps, 10**7 + r * steps, policy=True),
        "guard": lambda r: bench.guarded_steps(steps, base=2 * 10**7 + r * steps),
    }
    for side in sides.values():  # warm-up
        side(-1)
    bench.plain_steps(plain, 200)
    ratios: dict[str, list[float]] = {k: [] for k in sides}
    us_plain = []
    for r in range(rounds):
        p = bench.plain_steps(plain, steps)
        us_plain.append(p / steps * 1e6)
        for k, side in sides.items():
            ratios[k].append(side(r) / p)
    reset()
    med = {k: statistics.median(v) for k, v in ratios.items()}
    return {
        "us_per_step_otel": round(statistics.median(us_plain), 2),
        "ratio": {k: round(v, 3) for k, v in med.items()},
        # shares of the plain step's cost: what each part adds
        "adds": {
            "otel_in_guarded_run": round(med["spans_in_run"] - 1.0, 3),
            "policy": round(med["spans_and_policy"] - med["spans_in_run"], 3),
            "sdk_glue": round(med["guard"] - med["spans_and_policy"], 3),
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--shares", action="store_true", help="in-context shares, no profiler")
    ap.add_argument("--rounds", type=int, default=9, help="with --shares")
    ap.add_argument("--pure-python", action="store_true", help="the policy's Python reference")
    args = ap.parse_args(argv)
    use_native(not args.pure_python)
    if args.shares:
        out = {
            "benchmark": "sdk_step_shares",
            "steps": args.steps,
            "rounds": args.rounds,
            "native": native_available() and not args.pure_python,
        }
        out.update(shares(args.steps, args.rounds))
        print(json.dumps(out))
        return 0
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(bench.NullExporter()))
    guard.configure(tracer_provider=provider, hmac_key=b"bench-key-0123456789")
    bench.guarded_steps(1000)  # warm caches and the native paths
    prof = cProfile.Profile()
    prof.enable()
    bench.guarded_steps(args.steps, base=10**6)
    prof.disable()
    reset()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    per_step = 1e6 / args.steps
    parts: dict[str, float] = {"otel": 0.0, "policy": 0.0, "sdk": 0.0, "other": 0.0}
    rows = []
    for (filename, line, name), (_, ncalls, tottime, _, _) in stats.items():
        part = _part(filename)
        parts[part] += tottime
        if part in ("sdk", "policy"):
            where = filename.rsplit("/guard/", 1)[-1]
            rows.append((tottime, f"guard/{where}:{line}({name})", ncalls))
    total = sum(parts.values())
    rows.sort(reverse=True)
    out = {
        "benchmark": "sdk_step_profile",
        "steps": args.steps,
        "profiled_us_per_step": round(total * per_step, 2),
        "share": {k: round(v / total, 3) for k, v in parts.items()},
        "top": [
            {
                "function": f,
                "calls_per_step": round(n / args.steps, 2),
                "share": round(t / total, 4),
            }
            for t, f, n in rows[: args.top]
        ],
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
