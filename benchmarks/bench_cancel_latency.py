"""Cancel latency: end of the offending step span in the agent -> the run observes the cancel.

A real guard (``otel-guard serve`` in its own process) and a real agent (this process: the SDK,
its real OTLP exporter and control stream). The guard's policy stops a run after 2 steps
without progress (``no_progress_steps: 2``); the agent's own detector waits for 8, so the stop
is the guard's decision. Each iteration is one run: step 1 and step 2 report
``progress(False)``; the clock starts when step 2's ``with guard.step()`` block exits (its span
has ended) and stops in the run's ``on_cancel`` callback. Prints JSON (milliseconds).
Goals: p50 <= 15 ms, p99 <= 50 ms.

``--mode cross``: two replicas (``serve`` with ``OTEL_GUARD_REDIS_URL``) share a
real redis-server; the agent's spans go to replica X (``span_endpoint``) and its control
stream to replica Y, so X decides and the cancel reaches Y over the Redis directive bus.
``--mode all`` (the default) measures, in the same run: ``single`` (one guard, no Redis),
``same_replica`` (the replicas with Redis, spans and stream both on Y) and
``cross_replica``. Each mode runs its agent in a fresh process. Goals: cross-replica p99 <=
20 ms, same-replica p99 <= 10 ms.

    python benchmarks/bench_cancel_latency.py [--runs 200] [--mode all|single|same|cross]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
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


def run_bench(runs: int, endpoint: str, span_endpoint: str | None = None) -> dict:
    import guard

    guard.configure(
        endpoint=endpoint, span_endpoint=span_endpoint, tenant="bench", admit_timeout_ms=3000
    )
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


def _child(mode: str, runs: int, endpoint: str, span_endpoint: str | None) -> dict:
    """One mode's agent in a process of its own (the SDK is configured once per process)."""
    cmd = [sys.executable, __file__, "--runs", str(runs), "--child", endpoint]
    if span_endpoint:
        cmd += ["--span-endpoint", span_endpoint]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600).stdout
    return {"mode": mode, **json.loads(out)}


def _replica_modes(tmp: str, cfg: Path, runs: int, modes: list[str]) -> list[dict]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.redisstate._server import RedisServer

    redis = RedisServer(Path(tmp))
    redis.start()
    env = {**os.environ, "OTEL_GUARD_DISABLED": "0", "OTEL_GUARD_REDIS_URL": redis.url}
    procs = []
    try:
        px, port_x = start_guard(str(cfg), env=env)
        procs.append(px)
        py, port_y = start_guard(str(cfg), env=env)
        procs.append(py)
        time.sleep(1.5)  # both replicas' first directory heartbeats (they list each other)
        x, y = f"127.0.0.1:{port_x}", f"127.0.0.1:{port_y}"
        out = []
        if "same" in modes:
            out.append(_child("same_replica", runs, y, y))
        if "cross" in modes:
            out.append(_child("cross_replica", runs, y, x))
        return out
    finally:
        for p in procs:
            p.terminate()
            p.wait(20)
        redis.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--mode", default="all", choices=["all", "single", "same", "cross"])
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--span-endpoint", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(run_bench(args.runs, args.child, args.span_endpoint)))
        return
    modes = ["single", "same", "cross"] if args.mode == "all" else [args.mode]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "guard.yaml"
        cfg.write_text(POLICY)
        if "single" in modes:
            proc, port = start_guard(str(cfg), env={**os.environ, "OTEL_GUARD_DISABLED": "0"})
            try:
                results.append(_child("single", args.runs, f"127.0.0.1:{port}", None))
            finally:
                proc.terminate()
                proc.wait(20)
        if "same" in modes or "cross" in modes:
            results.extend(_replica_modes(tmp, cfg, args.runs, modes))
    if len(results) == 1:
        print(json.dumps(results[0], indent=2))
        return
    goals = {"same_replica": 10.0, "cross_replica": 20.0}
    print(
        json.dumps(
            {
                "benchmark": "cancel_latency",
                "modes": results,
                "goals_p99_ms": goals,
                "meets_replica_goals": all(
                    r["p99_ms"] <= goals[r["mode"]] for r in results if r["mode"] in goals
                ),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
