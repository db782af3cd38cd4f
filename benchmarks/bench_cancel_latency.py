"""Cancel latency: end of the offending step span in the agent -> the run observes the cancel.

A real guard (``otel-guard serve`` in its own process) and a real agent (this process: the SDK,
its real OTLP exporter and control stream). The guard's policy stops a run after 2 steps
without progress (``no_progress_steps: 2``); the agent's own detector waits for 8, so the stop
is the guard's decision. Each iteration is one run: step 1 and step 2 report
``progress(False)``; the clock starts when step 2's ``with guard.step()`` block exits (its span
has ended) and stops in the run's ``on_cancel`` callback. Prints JSON (milliseconds).
Goals: p50 <= 15 ms, p99 <= 50 ms.

    python benchmarks/bench_cancel_latency.py [--runs 200]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from _net import start_guard  # benchmarks/ is on sys.path when run as a script

POLICY = """
runs:
  max_steps: 100
  loop: {window: 20, repeat_threshold: 3, no_progress_steps: 2}
"""


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def run_bench(runs: int, endpoint: str) -> dict:
    import guard

    guard.configure(endpoint=endpoint, tenant="bench", admit_timeout_ms=3000)
    latencies: list[float] = []
    decided: dict[str, int] = {}

    @guard.run(agent="latency-bot", max_steps=50)
    def agent() -> None:
        run = guard.current_run()
        cancelled = threading.Event()
        seen: list[float] = []

        def observed() -> None:
            seen.append(time.perf_counter())
            cancelled.set()

        run.on_cancel(observed)
        for i in range(1, 10):
            with guard.step() as step:
                step.progress(False)
            ended = time.perf_counter()
            if i >= 2 and cancelled.wait(2.0):
                latencies.append((seen[0] - ended) * 1000.0)
                break
        run.raise_if_cancelled()

    for _ in range(5):  # warm up: connection, imports, first admits
        with contextlib.suppress(guard.RunStopped):
            agent()
    latencies.clear()
    for _ in range(runs):
        try:
            agent()
        except guard.RunStopped as stop:
            key = f"{stop.outcome.reason}/{stop.outcome.decided_by}"
            decided[key] = decided.get(key, 0) + 1
    guard.shutdown()
    return {
        "benchmark": "cancel_latency",
        "runs": runs,
        "measured": len(latencies),
        "stopped_by": decided,
        "p50_ms": round(_percentile(latencies, 0.50), 3),
        "p90_ms": round(_percentile(latencies, 0.90), 3),
        "p99_ms": round(_percentile(latencies, 0.99), 3),
        "max_ms": round(max(latencies), 3),
        "mean_ms": round(statistics.fmean(latencies), 3),
        "goals_ms": {"p50": 15, "p99": 50},
        "meets_goals": _percentile(latencies, 0.5) <= 15 and _percentile(latencies, 0.99) <= 50,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "guard.yaml"
        cfg.write_text(POLICY)
        proc, port = start_guard(str(cfg), env={**os.environ, "OTEL_GUARD_DISABLED": "0"})
        try:
            result = run_bench(args.runs, f"127.0.0.1:{port}")
        finally:
            proc.terminate()
            proc.wait(20)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
