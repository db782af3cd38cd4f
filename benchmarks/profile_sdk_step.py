"""Where a guarded step's time goes: the step of ``bench_sdk_overhead.py`` under cProfile.

Splits the profiled time per step into OpenTelemetry (the spans, the same on both sides of the
overhead benchmark), the policy (``guard/policy``), the SDK's own glue (``guard/sdk``) and the
rest (builtins called from all of them), and lists the heaviest SDK and policy functions by
their own time. cProfile inflates small functions, so read the shares, not the microseconds.

    .venv/bin/python benchmarks/profile_sdk_step.py [--steps 10000] [--top 15]

Prints JSON.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats

import bench_sdk_overhead as bench  # the same step and spans (run from benchmarks/' parent)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import guard
from guard.sdk._api import reset


def _part(filename: str) -> str:
    if "opentelemetry" in filename:
        return "otel"
    if "/guard/policy/" in filename:
        return "policy"
    if "/guard/sdk/" in filename or "/guard/semconv" in filename:
        return "sdk"
    return "other"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args(argv)
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
