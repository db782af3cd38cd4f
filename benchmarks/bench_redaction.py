"""What redaction costs on the SDK's export path to the guard, per span.

The redaction (``guard.sdk._redact.RedactingSpanExporter``) runs on the export thread, before
the OTLP exporter encodes the batch. Baseline, in the same run: the OTLP encoding of the same
batch (``encode_spans(...).SerializeToString()``), which that thread does anyway. Two loads:

* ``own``: the SDK's own spans of guarded steps (run, step, model-call and tool-call spans),
  which carry no content: the check must cost next to nothing and copy nothing;
* ``foreign``: GenAI spans of another instrumentation with content on (OpenInference-style
  messages, input/output values, a content event), each copied without its content.

    .venv/bin/python benchmarks/bench_redaction.py [--steps 2000] [--rounds 7]

Prints JSON: us_per_span_{encode,redact}_{own,foreign}, ratio_own = (encode + redact) /
encode for our own spans (goal <= 1.05), spans copied per load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

import guard
from guard.sdk._redact import RedactingSpanExporter
from guard.testing import capture_spans


class NullExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def own_spans(steps: int) -> list[ReadableSpan]:
    with capture_spans(hmac_key=b"bench-key-0123456789") as sink:

        @guard.run(agent="bench", max_steps=steps + 10, max_tool_calls=steps + 10)
        def agent() -> None:
            for i in range(steps):
                with guard.step() as step:
                    step.model_call(model="gpt-4.1", input_tokens=1200 + i, output_tokens=90)
                    step.tool_call("search", {"q": f"refund {i}"}, result=i)
                    step.progress(True)

        agent()
        return list(sink.spans)


def foreign_spans(n: int) -> list[ReadableSpan]:
    with capture_spans() as sink:
        tracer = sink.provider.get_tracer("openinference")
        for i in range(n):
            with tracer.start_as_current_span(
                "ChatCompletion",
                attributes={
                    "openinference.span.kind": "LLM",
                    "llm.model_name": "gpt-4o-mini",
                    "llm.token_count.prompt": 1200 + i,
                    "llm.token_count.completion": 90,
                    "input.value": '{"messages": [{"role": "user", "content": "refund?"}]}',
                    "output.value": "Your refund was issued.",
                    "llm.input_messages.0.message.role": "user",
                    "llm.input_messages.0.message.content": "Where is my refund?",
                    "llm.output_messages.0.message.content": "Your refund was issued.",
                },
            ) as s:
                s.add_event("gen_ai.choice", {"message": "Your refund was issued."})
        return list(sink.spans)


def timed(fn: Callable[[], object], rounds: int, n: int) -> float:
    """Median µs per span over ``rounds`` calls of ``fn`` (each handles ``n`` spans)."""
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(out)


def measure(spans: list[ReadableSpan], rounds: int) -> dict[str, float]:
    red = RedactingSpanExporter(NullExporter())
    batches = [spans[i : i + 512] for i in range(0, len(spans), 512)]  # the export batch size

    def encode() -> None:
        for b in batches:
            encode_spans(b).SerializeToString()

    def redact() -> None:
        for b in batches:
            red.export(b)

    encode()
    redact()  # warm-up: the clean-key set is filled once per process
    red.redacted_spans = 0
    e = timed(encode, rounds, len(spans))
    r = timed(redact, rounds, len(spans))
    return {"encode": e, "redact": r, "copied_per_round": red.redacted_spans / rounds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    own = own_spans(args.steps)
    foreign = foreign_spans(args.steps)
    o = measure(own, args.rounds)
    f = measure(foreign, args.rounds)
    result = {
        "benchmark": "redaction",
        "spans_own": len(own),
        "spans_foreign": len(foreign),
        "rounds": args.rounds,
        "us_per_span_encode_own": round(o["encode"], 3),
        "us_per_span_redact_own": round(o["redact"], 3),
        "us_per_span_encode_foreign": round(f["encode"], 3),
        "us_per_span_redact_foreign": round(f["redact"], 3),
        "ratio_own": round((o["encode"] + o["redact"]) / o["encode"], 3),
        "ratio_foreign": round((f["encode"] + f["redact"]) / f["encode"], 3),
        "copied_own": o["copied_per_round"],
        "copied_foreign": f["copied_per_round"],
        "goal_ratio_own": 1.05,
        "ok": (o["encode"] + o["redact"]) / o["encode"] <= 1.05 and o["copied_per_round"] == 0,
        "python": sys.version.split()[0],
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
