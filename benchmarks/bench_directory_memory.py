"""Memory of the run directory in Redis (``guard.server.directory._redis``): bytes per 1,000
live runs (``MEMORY USAGE`` of their entries, and ``used_memory`` before/after), against a
real redis-server on loopback, plus the round trips of a claim batch and a heartbeat.
Prints JSON.

    python benchmarks/bench_directory_memory.py [--runs 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from guard.policy import Budget, Limits  # noqa: E402
from guard.server._redis import StateClient  # noqa: E402
from guard.server.directory._redis import RedisDirectory  # noqa: E402
from guard.server.runs._state import RunState  # noqa: E402
from tests.redisstate._server import RedisServer  # noqa: E402


def _run(i: int) -> RunState:
    limits = Limits(max_steps=50, max_cost_usd=2.0, max_tokens=200_000, deadline_s=600.0)
    return RunState(
        f"run-{i:08d}-4f1c2b7e9d",
        tenant=f"tenant-{i % 100}",
        agent="support-bot",
        parent_run_id="",
        trace_id=b"",
        started_at=0.0,
        budget=Budget(limits),
        detector=None,
        forecaster=None,
        soft=None,
    )


async def bench(n: int, url: str) -> dict:
    state = StateClient(url, socket_timeout_ms=5000)
    registry = types.SimpleNamespace(runs={})  # the directory reads only registry.runs here
    d = RedisDirectory(registry, state, guard_id="replica-a")
    session = types.SimpleNamespace(runs=set(), process_id="host-1:4242")
    before = (await state.command("INFO", "memory"))["used_memory"]
    runs = [_run(i) for i in range(n)]
    for r in runs:
        d.claim(r, session)
    trips = state.stats["round_trips"]
    await d.flush()
    claim_trips = state.stats["round_trips"] - trips
    trips = state.stats["round_trips"]
    await d.beat()
    beat_trips = state.stats["round_trips"] - trips
    after = (await state.command("INFO", "memory"))["used_memory"]
    sample = runs[:: max(1, n // 200)]
    usage = [await state.command("MEMORY", "USAGE", d.key(r.run_id)) for r in sample]
    server = (await state.command("INFO", "server")).get("redis_version")
    await state.aclose()
    per_entry = sum(usage) / len(usage)
    return {
        "benchmark": "directory_memory",
        "redis_server": server,
        "runs": n,
        "memory_usage_per_entry_bytes": round(per_entry, 1),
        "memory_usage_per_1k_runs_kb": round(per_entry * 1000 / 1024, 1),
        "used_memory_delta_per_1k_runs_kb": round((after - before) / n * 1000 / 1024, 1),
        "round_trips_claim_batch": claim_trips,
        "round_trips_heartbeat": beat_trips,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        srv = RedisServer(Path(tmp))
        srv.start()
        try:
            result = asyncio.run(bench(args.runs, srv.url))
        finally:
            srv.stop()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
