"""Ingest throughput: spans per CPU-second of the receiving process, against baselines.

``--load fleet`` (the default; see ``_fleet_bench`` for the method): the spans the
real SDK exports for guarded runs (run span, steps, model calls, tool calls), replayed under
fresh run ids for 8 tenants with caps, three rolling windows each and bearer tokens; every run
registered, admitted, acked, heart-beaten and ended over its tenant's control stream, new runs
throughout, 8 Export requests in flight. Receivers: the guard with full policy (and with
``--pure-python`` the same guard with ``OTEL_GUARD_PURE_PYTHON=1``), the decode-only floor,
rotel into its blackhole exporter and rotel forwarding to the floor. The guard's CPU is split
into the span path and the control path by measuring the control traffic alone on the same
process. Every ratio is taken within one trial; medians over ``--runs`` trials.

    python benchmarks/bench_ingest.py [--runs 5] [--requests 300] [--pure-python] [--no-rotel]
    python benchmarks/bench_ingest.py --runs 1 --no-rotel --profile /tmp/guard.prof

``--profile P``: cProfile the guard's control phase into ``P.0.0`` and its full phase into
``P.0.1`` (``pstats``; a profiled run's figures are not to be quoted).

``--load simple``: the load of the earlier issues, kept so old figures can be compared: three
receivers get the same pre-serialised synthetic load (512-span requests of guarded steps: one
model call, two tool calls and a step end per step, across 256 live runs of one tenant,
registered once over one control stream, no auth): the guard, the floor, and rotel forwarding
(gzip, its default) to the floor. ``--numbered``: every counted span carries its record number
(``guard.seq``). ``--metrics``: also a guard with its own metrics on (``guard.metrics.listen``),
reported as ``guard_metrics`` with its ratio to the plain guard (``metrics_vs_plain``).

spans/s/core = spans sent / CPU seconds (user + system) of the receiving process, read from
its CPU clock (``clock_getcpuclockid``; ``/proc/<pid>/stat`` ticks as the fallback). Prints
JSON. Goals (fleet): guard >= 1.0x rotel blackhole and >= 0.5x the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from _measure import EXPORT, cpu_seconds, drive, measure_load  # benchmarks/ is on sys.path
from _receivers import floor_main
from _simple_load import (
    METRICS_POLICY,
    POLICY,
    RUNS,
    STEPS_PER_REQUEST,
    build_requests,
    measure,
    register_runs,
    simple,
    tenant_of,
)

# what the other ingest scripts import from here (bench_redis_ingest, bench_replicas_scaling,
# bench_http_ingest): the simple load and the measuring primitives
_register_runs = register_runs
__all__ = [
    "EXPORT",
    "METRICS_POLICY",
    "POLICY",
    "RUNS",
    "STEPS_PER_REQUEST",
    "build_requests",
    "cpu_seconds",
    "drive",
    "main",
    "measure",
    "measure_load",
    "tenant_of",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--load", choices=["fleet", "simple"], default="fleet")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--runs", type=int, default=5, help="trials (fleet); medians over them")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--no-rotel", action="store_true")
    parser.add_argument("--pure-python", action="store_true", help="also OTEL_GUARD_PURE_PYTHON=1")
    parser.add_argument("--rotel-gzip", action="store_true", help="rotel forwards gzipped")
    parser.add_argument(
        "--old-agents", action="store_true", help="fleet: agents as the SDK before batches"
    )
    parser.add_argument("--numbered", action="store_true", help="guard.seq on the spans (simple)")
    parser.add_argument("--metrics", action="store_true", help="also a guard with metrics on")
    parser.add_argument("--profile", help="fleet: cProfile the guard into this file (pstats)")
    parser.add_argument("--role", choices=["floor", "capture"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=10, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "floor":
        asyncio.run(floor_main(args.port))
        return
    if args.role == "capture":
        from _fleet import capture_main

        capture_main(args.address, args.out, args.steps)
        return
    if args.load == "fleet":
        from _fleet_bench import fleet

        print(json.dumps(fleet(args), indent=2))
        return
    print(json.dumps(simple(args), indent=2))


if __name__ == "__main__":
    main()
