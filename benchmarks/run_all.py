"""Run every benchmark, one after another, and print one JSON object with their results.

Each benchmark is its own process (so one's memory or threads never skew another's) and
prints JSON; this script only collects them and reads off the figures of the table in docs/benchmarks.md (and the README's headline rows).

    python benchmarks/run_all.py [--quick] [--out results.json]

``--quick`` shrinks the workloads (a smoke run, not figures to quote).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# name -> (script, full args, quick args)
BENCHMARKS: dict[str, tuple[str, list[str], list[str]]] = {
    # the fleet-shaped load, median of 5 trials, the pure-Python guard beside it
    "ingest": ("bench_ingest.py", ["--pure-python"], ["--runs", "1", "--requests", "40"]),
    # the synthetic load of the earlier issues, to compare with their figures
    "ingest_simple": (
        "bench_ingest.py",
        ["--load", "simple"],
        ["--load", "simple", "--requests", "40"],
    ),
    "http_ingest": ("bench_http_ingest.py", [], ["--requests", "40", "--json-requests", "5"]),
    "redis_ingest": (
        "bench_redis_ingest.py",
        ["--pairs", "3"],
        ["--pairs", "1", "--requests", "40"],
    ),
    "replicas_scaling": ("bench_replicas_scaling.py", [], ["--trials", "1", "--requests", "40"]),
    "cancel_latency": ("bench_cancel_latency.py", [], ["--runs", "30"]),
    "sdk_waits": ("bench_sdk_waits.py", [], ["--runs", "10"]),
    "sdk_overhead": ("bench_sdk_overhead.py", [], ["--steps", "300", "--rounds", "3"]),
    "redaction": ("bench_redaction.py", [], ["--steps", "300", "--rounds", "3"]),
    "memory": ("bench_memory.py", [], ["--runs", "1000"]),
    "store": ("bench_store.py", [], ["--runs", "20000", "--seed-runs", "50000", "--repeat", "3"]),
    "loop_corpus": ("loop_corpus.py", [], []),
    # the same corpus replayed through the real frameworks (guard.instrument() and @guard.run
    # alone, on the scripted local model server): what an integration gives the detector
    "loop_corpus_frameworks": (
        "loop_corpus.py",
        ["--frameworks", "agents,pydantic_ai"],
        ["--frameworks", "agents,pydantic_ai", "--quick"],
    ),
    "reservations": (
        "bench_reservations.py",
        [],
        ["--trials", "1", "--calls", "300", "--repeat", "1"],
    ),
    "reservations_replicas": (
        "bench_reservations.py",
        ["--parts", "tenant", "--trials", "3", "--replicas", "3"],
        ["--parts", "tenant", "--trials", "1", "--replicas", "3"],
    ),
    # a tenant budget at both ends: calls served past it, and budget refused while unspent
    "tenant_budget": ("bench_tenant_budget.py", [], ["--quick"]),
}


def run_one(script: str, args: list[str]) -> dict:
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(HERE / script), *args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}", "stderr": proc.stderr[-2000:]}
    # The JSON object is the last thing each benchmark prints.
    text = proc.stdout[proc.stdout.find("{") :]
    result = json.loads(text)
    result["_wall_s"] = round(time.perf_counter() - started, 1)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small workloads (smoke run)")
    ap.add_argument("--only", nargs="*", choices=sorted(BENCHMARKS), help="a subset")
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    ns = ap.parse_args()
    results = {}
    for name, (script, full, quick) in BENCHMARKS.items():
        if ns.only and name not in ns.only:
            continue
        print(f"running {name} ...", file=sys.stderr, flush=True)
        results[name] = run_one(script, quick if ns.quick else full)
    text = json.dumps(results, indent=2)
    print(text)
    if ns.out:
        ns.out.write_text(text + "\n")
    return 1 if any("error" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
