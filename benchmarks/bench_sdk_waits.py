"""The SDK's waits, as figures: what the tests used to assert on the wall clock.

- ``local_cancel``: ``run.cancel()`` from another thread -> the awaiting task of the run gets
  ``RunStopped`` (the step awaits a 60 s "model call"). Goal: p99 < 100 ms.
- ``admission_unanswered``: a guard that holds the stream open but never answers a
  ``RunStarted``: how long the run's start waits (``admit_timeout_ms`` 100). Goal: within
  [90, 1000) ms, i.e. the timeout and not much more.
- ``admission_known_down``: no guard listening (the first connect attempt has failed): how
  long a run's start waits. Goal: p99 < 90 ms (no admission wait at all).

Real parts: the SDK, a real grpc GuardControl servicer on 127.0.0.1:0 (the tests'
``FakeGuard``), a loopback port nobody listens on. Prints JSON (milliseconds).

    python benchmarks/bench_sdk_waits.py [--runs 50]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "sdk"))  # the tests' in-process GuardControl servicer

from _sdk_fake_guard import FakeGuard  # noqa: E402

import guard  # noqa: E402
from guard.testing import capture_spans  # noqa: E402


def _summary(ms: list[float]) -> dict[str, float]:
    xs = sorted(ms)
    return {
        "p50_ms": round(statistics.median(xs), 3),
        "p99_ms": round(xs[min(len(xs) - 1, int(len(xs) * 0.99))], 3),
        "max_ms": round(xs[-1], 3),
        "n": len(xs),
    }


async def _one_local_cancel() -> float:
    started = asyncio.Event()
    box: dict = {}

    @guard.run(agent="bench")
    async def f() -> None:
        box["run"] = guard.current_run()
        async with guard.step():
            started.set()
            await asyncio.sleep(60)

    task = asyncio.ensure_future(f())
    await started.wait()
    sent: dict = {}

    def cancel() -> None:
        sent["t0"] = time.perf_counter()
        box["run"].cancel("user_cancel")

    threading.Thread(target=cancel).start()
    with contextlib.suppress(guard.RunStopped):
        await task
    return (time.perf_counter() - sent["t0"]) * 1000.0


def local_cancel(runs: int) -> dict[str, float]:
    with capture_spans():
        return _summary([asyncio.run(_one_local_cancel()) for _ in range(runs)])


def _timed_runs(runs: int) -> list[float]:
    @guard.run(agent="bench")
    def f() -> str:
        return "ok"

    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        f()
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def admission_unanswered(runs: int) -> dict[str, float]:
    fake = FakeGuard()  # admits the warm-up run (the stream is up), then never answers
    try:
        with capture_spans(endpoint=fake.endpoint, admit_timeout_ms=100, reconnect_min_s=0.05):
            _timed_runs(1)
            fake.decide = lambda rs: None
            return _summary(_timed_runs(runs))
    finally:
        fake.stop()


def admission_known_down(runs: int) -> dict[str, float]:
    from guard.sdk._runtime import get_runtime

    with capture_spans(
        endpoint="127.0.0.1:9", admit_timeout_ms=100, reconnect_min_s=0.05, export_timeout_s=0.2
    ):
        _timed_runs(1)
        control = get_runtime().control
        assert control is not None and control.first_attempt_done.wait(5)
        return _summary(_timed_runs(runs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    ns = ap.parse_args()
    out = {
        "local_cancel": local_cancel(ns.runs),
        "admission_unanswered": admission_unanswered(ns.runs),
        "admission_known_down": admission_known_down(ns.runs),
    }
    out["goals_met"] = {
        "local_cancel_p99_lt_100ms": out["local_cancel"]["p99_ms"] < 100,
        "admission_unanswered_90_to_1000ms": 90 <= out["admission_unanswered"]["p50_ms"] < 1000,
        "admission_known_down_p99_lt_90ms": out["admission_known_down"]["p99_ms"] < 90,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
