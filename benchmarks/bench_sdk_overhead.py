"""SDK overhead per step: guard.step() vs the same spans through plain OpenTelemetry.

One step = a ``guard.step`` span with a model-call span and a tool-call span inside it, with
the same names and attributes on both sides, each side into a TracerProvider whose processor
hands every span to the same no-op exporter. The guard side additionally runs the whole local policy:
three decisions per step (before the step, after the model call, after the tool call), the
HMAC fingerprints of the tool arguments and result, and the loop detector. Both sides run
alternately in the same process; the figure is the median over rounds.

Fairness: the plain side emits the same spans with the same attribute values (the guard's
computed cost, 1-based step index, provider name; fingerprints precomputed outside the timed
loop), checked on a separate provider before timing (``same_spans``). The guard side's tool
arguments are new in every round, so its canonicalisation cache is not flattered by repeats.
The plain side's provider is a provider of its own: ``guard.configure`` puts the SDK's span
processor (its relay) on the guard side's provider, which an application without the guard
does not have, so its cost is the guard's. Time is the thread's CPU time
(``time.thread_time``), not the wall clock: neither side starts a thread, and on a shared
machine a descheduled round would otherwise count against whichever side it hit.

    .venv/bin/python benchmarks/bench_sdk_overhead.py [--steps 2000] [--rounds 7] [--numbered]

``--numbered``: the spans carry their record numbers (``guard.seq``), as they do when the SDK
has a control stream to a guard; the plain side then emits the same attribute too.

The headline runs the install as shipped: the native fast paths of guard/policy/_speedups.c
when a C compiler built them (``native``). The same run also measures the pure-Python
reference (``ratio_pure_python``), what an install without a compiler gets.

Prints JSON: us_per_step_guard, us_per_step_otel, ratio (goal <= 1.25; the outer bound 1.5),
ratio_pure_python (goal <= 1.4).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import guard
from guard.policy import DEFAULT_PRICE_BOOK, native_available, use_native
from guard.sdk._api import reset
from guard.sdk._runtime import get_runtime

_NATIVE_BUILT = native_available()  # the native fast paths were built
# CPU time of this thread (see the module doc): what a step costs, whatever else the machine runs
_clock = time.thread_time
GOAL_RATIO, GOAL_RATIO_PURE = 1.25, 1.4  # the outer bound is 1.5


class NullExporter(SpanExporter):
    def __init__(self) -> None:
        self.count = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.count += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


NUMBERED = False  # --numbered: guard.seq on the counted spans, both sides


def _seq(attrs: dict[str, Any], seq: int) -> dict[str, Any]:
    if NUMBERED:
        attrs["guard.seq"] = seq
    return attrs


def guarded_steps(n: int, base: int = 0) -> float:
    """``base`` makes every round's tool arguments new, so the guard's canonicalisation cache
    (which helps real loops) cannot flatter the figure with repeats from earlier rounds."""

    @guard.run(agent="bench", max_steps=n + 10, max_tokens=10**12, max_tool_calls=n + 10)
    def agent() -> float:
        t0 = _clock()
        for i in range(n):
            with guard.step() as step:
                step.model_call(model="gpt-4.1", input_tokens=1200 + i, output_tokens=90)
                step.tool_call("search", {"q": f"refund {base + i}", "lang": "en"}, result=i)
                step.progress(True)
        return _clock() - t0

    return agent()


def _cost_usd(i: int) -> float | None:
    return DEFAULT_PRICE_BOOK.cost_usd("gpt-4.1", input_tokens=1200 + i, output_tokens=90)


def plain_steps(tracer: trace.Tracer, n: int) -> float:
    """The same spans and attributes, values included, emitted by hand. What the guard
    computes (fingerprints, cost) is precomputed here, outside the timed loop."""
    run_id = uuid.uuid4().hex
    fp, rh = "a" * 32, "b" * 32
    costs = [_cost_usd(i) for i in range(n)]
    run_span = tracer.start_span(
        "invoke_agent bench",
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "bench",
            "guard.run.id": run_id,
            "guard.tenant": "default",
        },
    )
    run_ctx = trace.set_span_in_context(run_span)
    token = otel_context.attach(run_ctx)
    t0 = _clock()
    for i in range(n):
        step = tracer.start_span(
            "guard.step",
            context=run_ctx,
            attributes=_seq(
                {"guard.run.id": run_id, "guard.tenant": "default", "guard.step.index": i + 1},
                3 * i + 1,
            ),
        )
        ctx = trace.set_span_in_context(step)
        tok = otel_context.attach(ctx)
        tracer.start_span(
            "chat gpt-4.1",
            context=ctx,
            kind=SpanKind.CLIENT,
            attributes=_seq(
                {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.request.model": "gpt-4.1",
                    "gen_ai.usage.input_tokens": 1200 + i,
                    "gen_ai.usage.output_tokens": 90,
                    "gen_ai.usage.cache_read.input_tokens": 0,
                    "gen_ai.usage.reasoning.output_tokens": 0,
                    "guard.run.id": run_id,
                    "gen_ai.provider.name": "openai",
                    "guard.cost.usd": costs[i],
                },
                3 * i + 2,
            ),
        ).end()
        tracer.start_span(
            "execute_tool search",
            context=ctx,
            kind=SpanKind.INTERNAL,
            attributes=_seq(
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "search",
                    "guard.action.fingerprint": fp,
                    "guard.tool.attempts": 1,
                    "guard.run.id": run_id,
                    "guard.result.hash": rh,
                },
                3 * i + 3,
            ),
        ).end()
        step.set_attributes({"guard.progress": True, "guard.action.fingerprint": fp})
        step.end()
        otel_context.detach(tok)
    elapsed = _clock() - t0
    run_span.set_attributes(
        {
            "guard.stop.status": "completed",
            "guard.stop.reason": "final_answer",
            "guard.usage.steps": n,
            "guard.usage.tool_calls": n,
            "guard.cost.usd": sum(costs),
        }
    )
    run_span.end()
    otel_context.detach(token)
    return elapsed


def _shape(spans: Sequence[ReadableSpan]) -> list[tuple[Any, ...]]:
    """What must match between the two sides: names, kinds, nesting, attribute keys and the
    values (types for the per-run random ids and fingerprints)."""
    random_keys = {"guard.run.id", "guard.action.fingerprint", "guard.result.hash"}
    ids = {s.context.span_id: s.name for s in spans}
    out = []
    for s in spans:
        attrs = {
            k: (type(v).__name__, len(v)) if k in random_keys else v
            for k, v in (s.attributes or {}).items()
        }
        parent = ids.get(s.parent.span_id) if s.parent is not None else None
        out.append((s.name, s.kind, parent, len(s.events), sorted(attrs.items())))
    return out


def check_same_spans() -> bool:
    """Fairness check, on a provider of its own: both sides emit the same spans with the same
    attributes (values included, up to the random ids and fingerprints)."""
    mem = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(mem))
    guard.configure(tracer_provider=provider, hmac_key=b"bench-key-0123456789")
    get_runtime().number_spans = NUMBERED
    guarded_steps(3)
    g = _shape(mem.get_finished_spans())
    mem.clear()
    plain_steps(provider.get_tracer("bench"), 3)
    p = _shape(mem.get_finished_spans())
    reset()
    for a, b in zip(g, p, strict=False):
        if a != b:
            print(f"guard: {a}\nplain: {b}", file=sys.stderr)
    return g == p


def idiomatic_steps(tracer: trace.Tracer, n: int) -> float:
    """The same spans written the way OpenTelemetry users usually write them: nested
    ``start_as_current_span`` blocks and ``set_attribute`` calls (a secondary reference)."""
    run_id = uuid.uuid4().hex
    fp, rh = "a" * 32, "b" * 32
    costs = [_cost_usd(i) for i in range(n)]
    with tracer.start_as_current_span("invoke_agent bench") as run_span:
        run_span.set_attribute("gen_ai.operation.name", "invoke_agent")
        run_span.set_attribute("guard.run.id", run_id)
        t0 = _clock()
        for i in range(n):
            with tracer.start_as_current_span("guard.step") as step:
                step.set_attribute("guard.run.id", run_id)
                step.set_attribute("guard.tenant", "default")
                step.set_attribute("guard.step.index", i + 1)
                if NUMBERED:
                    step.set_attribute("guard.seq", 3 * i + 1)
                with tracer.start_as_current_span("chat gpt-4.1", kind=SpanKind.CLIENT) as m:
                    m.set_attribute("gen_ai.operation.name", "chat")
                    m.set_attribute("gen_ai.request.model", "gpt-4.1")
                    m.set_attribute("gen_ai.usage.input_tokens", 1200 + i)
                    m.set_attribute("gen_ai.usage.output_tokens", 90)
                    m.set_attribute("gen_ai.usage.cache_read.input_tokens", 0)
                    m.set_attribute("gen_ai.usage.reasoning.output_tokens", 0)
                    m.set_attribute("guard.run.id", run_id)
                    m.set_attribute("gen_ai.provider.name", "openai")
                    m.set_attribute("guard.cost.usd", costs[i])
                    if NUMBERED:
                        m.set_attribute("guard.seq", 3 * i + 2)
                with tracer.start_as_current_span("execute_tool search") as t:
                    t.set_attribute("gen_ai.operation.name", "execute_tool")
                    t.set_attribute("gen_ai.tool.name", "search")
                    t.set_attribute("guard.action.fingerprint", fp)
                    t.set_attribute("guard.tool.attempts", 1)
                    t.set_attribute("guard.run.id", run_id)
                    t.set_attribute("guard.result.hash", rh)
                    if NUMBERED:
                        t.set_attribute("guard.seq", 3 * i + 3)
                step.set_attribute("guard.progress", True)
                step.set_attribute("guard.action.fingerprint", fp)
        return _clock() - t0


def policy_breakdown(n: int) -> dict[str, float]:
    """Where the guard's extra time goes: the pure policy work of one step, timed alone."""
    from guard.policy import Budget, Fingerprinter, Limits, LoopDetector, Phase

    budget = Budget(Limits(max_steps=10**9, max_tokens=10**12, max_tool_calls=10**9))
    fused = Budget(Limits(max_steps=10**9, max_tokens=10**12, max_tool_calls=10**9))
    fp = Fingerprinter(b"bench-key-0123456789")
    loops = LoopDetector()

    def timed(fn) -> float:
        t0 = _clock()
        for i in range(n):
            fn(i)
        return round((_clock() - t0) / n * 1e6, 2)

    acts = [fp.action("search", {"q": f"refund {i}", "lang": "en"}) for i in range(n)]
    n0 = n  # fingerprint_args below sees new arguments (a cache miss), as a real agent does
    res = [fp.result(i) for i in range(n)]
    out = {
        # What the SDK runs: the quick pre-check, a full decision only when one could fire.
        "decide_x3": timed(
            lambda i: (
                budget.escalation(),
                budget.escalation(phase=Phase.AFTER_MODEL_CALL),
                budget.escalation(phase=Phase.AFTER_TOOL_BATCH),
            )
        ),
        "decide_x3_full": timed(
            lambda i: (
                budget.decide(),
                budget.decide(phase=Phase.AFTER_MODEL_CALL),
                budget.decide(phase=Phase.AFTER_TOOL_BATCH),
            )
        ),
        "record_usage": timed(
            lambda i: (
                budget.record_step(),
                budget.record_model_call(input_tokens=1200, output_tokens=90, cost_usd=0.003),
                budget.record_tool_calls(1),
            )
        ),
        # What the SDK runs per step instead of the two lines above: each record fused with
        # its quick decision under one lock (not part of "total", which keeps its meaning).
        "record_and_decide_fused": timed(
            lambda i: (
                fused.step_if_no_escalation(0),
                fused.model_call_escalation(1200, 90, 0, 0, 0.003, 0),
                fused.tool_call_escalation(1, None, None, 0),
            )
        ),
        "fingerprint_args": timed(
            lambda i: fp.action("search", {"q": f"refund {n0 + i}", "lang": "en"})
        ),
        "hash_result": timed(lambda i: fp.result(i)),
        "loop_detector": timed(
            lambda i: (
                loops.observe_action(acts[i], res[i]),
                loops.end_step(state=None, progress=True, acted=True),
            )
        ),
    }
    out["total"] = round(
        sum(v for k, v in out.items() if k not in ("decide_x3_full", "record_and_decide_fused")),
        2,
    )
    return out


def paired_rounds(tracer: trace.Tracer, steps: int, rounds: int, seed: int) -> dict[str, float]:
    """Guarded, plain and idiomatic steps, alternating (load drift on the machine hits all
    three); medians over the rounds. ``seed`` keeps every round's tool arguments new.
    ``tracer``: the plain sides' (a provider without the guard's processor)."""
    g, p, ratios, idio = [], [], [], []
    for r in range(rounds):
        g.append(guarded_steps(steps, base=(seed + r) * steps) / steps * 1e6)
        p.append(plain_steps(tracer, steps) / steps * 1e6)
        idio.append(idiomatic_steps(tracer, steps) / steps * 1e6)
        ratios.append(g[-1] / p[-1])
    return {
        "guard": statistics.median(g),
        "otel": statistics.median(p),
        "idiomatic": statistics.median(idio),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
    }


def set_native(on: bool) -> None:
    """Use the native fast paths (when built) or the pure-Python reference; takes effect for
    the fingerprinters and detectors made afterwards (configure() makes new ones)."""
    use_native(on)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--numbered", action="store_true", help="guard.seq on the spans")
    args = ap.parse_args(argv)
    global NUMBERED
    NUMBERED = args.numbered

    same = check_same_spans()
    exporter = NullExporter()
    provider = TracerProvider()  # the guard side's: guard.configure adds its processor to it
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    plain_provider = TracerProvider()  # the plain sides': the application without the guard
    plain_provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = plain_provider.get_tracer("bench")

    def configure(native: bool) -> None:
        set_native(native)
        guard.configure(tracer_provider=provider, hmac_key=b"bench-key-0123456789")
        get_runtime().number_spans = NUMBERED  # what a control stream turns on
        guarded_steps(200, base=-1000)  # warm-up both paths
        plain_steps(tracer, 200)

    # The install as shipped: native fast paths when a C compiler built them.
    configure(native=True)
    main_ = paired_rounds(tracer, args.steps, args.rounds, seed=0)
    breakdown = policy_breakdown(args.steps)
    # The pure-Python reference (an install without a C compiler), in the same run.
    configure(native=False)
    pure = paired_rounds(tracer, args.steps, args.rounds, seed=args.rounds)
    set_native(True)
    result = {
        "benchmark": "sdk_overhead",
        "steps_per_round": args.steps,
        "rounds": args.rounds,
        "spans_per_step": 3,
        "numbered": NUMBERED,
        "native": _NATIVE_BUILT,
        "us_per_step_guard": round(main_["guard"], 2),
        "us_per_step_otel": round(main_["otel"], 2),
        "ratio": round(main_["ratio"], 3),
        "ratio_min": round(main_["ratio_min"], 3),
        # secondary reference: the same spans via start_as_current_span + set_attribute
        "us_per_step_otel_idiomatic": round(main_["idiomatic"], 2),
        "ratio_vs_idiomatic": round(main_["guard"] / main_["idiomatic"], 3),
        "us_per_step_guard_pure_python": round(pure["guard"], 2),
        "us_per_step_otel_pure_python_run": round(pure["otel"], 2),
        "ratio_pure_python": round(pure["ratio"], 3),
        "goal_ratio": GOAL_RATIO,
        "goal_ratio_pure_python": GOAL_RATIO_PURE,
        "same_spans": same,
        "ok": main_["ratio"] <= GOAL_RATIO and pure["ratio"] <= GOAL_RATIO_PURE,
        "policy_us_per_step": breakdown,
        "spans_exported": exporter.count,
        "clock": "thread_time",
        "python": sys.version.split()[0],
    }
    print(json.dumps(result))
    reset()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
