"""Ingest throughput: spans per CPU-second of the receiving process, against baselines.

``--load fleet`` (the default; DESIGN §5, see ``_fleet_bench`` for the method): the spans the
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
import hashlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import grpc
from _net import start_guard  # benchmarks/ is on sys.path when run as a script
from _receivers import floor_main, start_floor, start_rotel
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
RUNS = 256
STEPS_PER_REQUEST = 128  # x 4 spans = 512 spans per request
DISTINCT_REQUESTS = 64
POLICY = """
runs:
  max_steps: 1000000000
  max_tokens: 1000000000000
  max_cost_usd: 1000000000.0
  deadline_s: 36000
tenants:
  acme:
    max_concurrent_runs: 100000
    rolling:
      - {metric: cost_usd, limit: 1000000000000.0, window_s: 3600}
      - {metric: tokens, limit: 1000000000000000.0, window_s: 60}
"""
METRICS_POLICY = """
guard:
  metrics:
    listen: 127.0.0.1:0
"""


def _kv(key: str, value: object) -> common_pb2.KeyValue:
    v = common_pb2.AnyValue()
    if isinstance(value, bool):
        v.bool_value = value
    elif isinstance(value, int):
        v.int_value = value
    else:
        v.string_value = str(value)
    return common_pb2.KeyValue(key=key, value=v)


def _hex(*parts: int) -> str:
    return hashlib.md5(repr(parts).encode()).hexdigest()  # fingerprint-shaped test data


def tenant_of(run: int, tenants: int = 1) -> str:
    """The tenant of run number ``run`` in a load spread over ``tenants`` tenants."""
    return "acme" if tenants == 1 else f"t{run % tenants}"


def build_requests(numbered: bool = False, tenants: int = 1) -> list[bytes]:
    out = []
    seqs = [0] * RUNS

    def seq(run: int) -> list[common_pb2.KeyValue]:
        if not numbered:
            return []
        seqs[run] += 1
        return [_kv("guard.seq", seqs[run])]

    for k in range(DISTINCT_REQUESTS):
        spans = []
        for j in range(STEPS_PER_REQUEST):
            n = k * STEPS_PER_REQUEST + j
            run = n % RUNS
            rid = f"run-{run:05d}"
            tid = run.to_bytes(16, "big")
            base = [_kv("guard.run.id", rid), _kv("guard.tenant", tenant_of(run, tenants))]
            spans.append(
                trace_pb2.Span(
                    name="chat gpt-4.1",
                    trace_id=tid,
                    span_id=_hex(n, 1)[:16].encode()[:8],
                    kind=trace_pb2.Span.SPAN_KIND_CLIENT,
                    attributes=[
                        *base,
                        _kv("gen_ai.operation.name", "chat"),
                        _kv("gen_ai.provider.name", "openai"),
                        _kv("gen_ai.request.model", "gpt-4.1"),
                        _kv("gen_ai.usage.input_tokens", 1000 + j),
                        _kv("gen_ai.usage.output_tokens", 100),
                        *seq(run),
                    ],
                )
            )
            for t in range(2):
                spans.append(
                    trace_pb2.Span(
                        name="execute_tool search",
                        trace_id=tid,
                        span_id=_hex(n, 2 + t)[:16].encode()[:8],
                        attributes=[
                            *base,
                            _kv("gen_ai.operation.name", "execute_tool"),
                            _kv("gen_ai.tool.name", "search"),
                            _kv("gen_ai.tool.call.id", f"call-{n}-{t}"),
                            _kv("guard.action.fingerprint", _hex(n, t, 7)),
                            _kv("guard.result.hash", _hex(n, t, 9)),
                            _kv("guard.tool.attempts", 1),
                            *seq(run),
                        ],
                    )
                )
            spans.append(
                trace_pb2.Span(
                    name="guard.step",
                    trace_id=tid,
                    span_id=_hex(n, 5)[:16].encode()[:8],
                    attributes=[
                        *base,
                        _kv("guard.step.index", k + 1),
                        _kv("guard.progress", True),
                        _kv("guard.state.hash", _hex(n, 11)),
                        *seq(run),
                    ],
                )
            )
        req = otlp.ExportTraceServiceRequest(resource_spans=[{"scope_spans": [{"spans": spans}]}])
        out.append(req.SerializeToString())
    return out


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, all threads) of ``pid``.

    The process CPU clock (``clock_getcpuclockid``) has nanosecond resolution; /proc/<pid>/stat
    counts 10 ms ticks, which is +-8% on the ~0.12 s the floor uses for 150 requests, so it is
    only the fallback.
    """
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        clock = ctypes.c_int()
        if libc.clock_getcpuclockid(pid, ctypes.byref(clock)) == 0:
            return time.clock_gettime(clock.value)
    except (OSError, AttributeError):
        pass
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- load -------------------------------------------------------------------------------
async def _register_runs(address: str, tenants: int = 1) -> tuple[object, object]:
    from guard.v1 import guard_pb2 as pb
    from guard.v1 import guard_pb2_grpc

    channel = grpc.aio.insecure_channel(address)
    stub = guard_pb2_grpc.GuardControlStub(channel)
    queue: asyncio.Queue = asyncio.Queue()

    async def requests():
        while True:
            item = await queue.get()
            if item is None:
                return
            yield item

    call = stub.Attach(requests())
    await queue.put(pb.AgentMessage(hello=pb.Hello(process_id="bench", tenant="acme")))
    for i in range(RUNS):
        rs = pb.RunStarted(
            run_id=f"run-{i:05d}",
            trace_id=i.to_bytes(16, "big").hex(),
            tenant=tenant_of(i, tenants),
            agent="bench",
            request_id=i + 1,
        )
        await queue.put(pb.AgentMessage(run_started=rs))
    admitted = 0
    async for msg in call:
        if msg.WhichOneof("body") == "admit":
            admitted += 1
            if admitted == RUNS:
                break
    return channel, (call, queue)


async def drive(
    address: str, payloads: list[bytes], n: int, concurrency: int, metadata=None, warm: int = 2
) -> float:
    """``n`` Export requests (``payloads`` round-robin, each with its ``metadata[i]`` when
    given) with ``concurrency`` in flight, after ``warm`` ones outside the wall time (but
    inside the caller's CPU window); returns wall seconds."""
    channel = grpc.aio.insecure_channel(
        address, options=[("grpc.max_send_message_length", 64 << 20)]
    )
    export = channel.unary_unary(EXPORT)
    counter = iter(range(n))
    md = metadata or [None] * len(payloads)

    async def worker() -> None:
        for i in counter:
            j = i % len(payloads)
            await export(payloads[j], metadata=md[j], timeout=60)

    for p, m in zip(payloads[:warm], md, strict=False):  # warm up
        await export(p, metadata=m, timeout=60)
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    await channel.close()
    return wall


def measure_load(name: str, pid: int, spans: int, load, *, pre=None, warm=None, post=None):
    """Spans per CPU-second of process ``pid`` over one timed phase: ``await pre()`` and
    ``await warm(kept)`` (not timed; ``kept`` is what ``pre`` returned), ``await load(kept)``
    (timed: it returns its wall seconds; the process CPU clock is read around it), then
    ``await post(kept)``."""

    async def go() -> tuple[float, float]:
        kept = await pre() if pre is not None else None
        try:
            if warm is not None:
                await warm(kept)
            c0 = cpu_seconds(pid)
            wall = await load(kept)
            return wall, cpu_seconds(pid) - c0
        finally:
            if post is not None:
                await post(kept)

    wall, cpu = asyncio.run(go())
    return {
        "receiver": name,
        "spans": spans,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "spans_per_s": round(spans / wall),
        "spans_per_s_per_core": round(spans / cpu) if cpu > 0 else None,
    }


def measure(name: str, pid: int, address: str, payloads, n: int, conc: int, pre=None) -> dict:
    """The simple load: ``n`` of ``payloads`` with ``conc`` in flight, after ``pre(address)``
    (e.g. :func:`_register_runs`) and a warm-up of 4 requests through the full path."""

    async def close(kept) -> None:
        if kept is not None:
            kept[1][1].put_nowait(None)
            await kept[0].close()

    return measure_load(
        name,
        pid,
        n * STEPS_PER_REQUEST * 4,
        lambda kept: drive(address, payloads, n, conc),
        pre=(lambda: pre(address)) if pre is not None else None,
        warm=lambda kept: drive(address, payloads, 4, conc),
        post=close,
    )


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


def simple(args) -> dict:
    """The load of the earlier issues (``--load simple``): one tenant, no auth, 256 runs
    registered once over one control stream, synthetic spans; figures comparable with
    theirs."""
    payloads = build_requests(args.numbered)
    results = []
    procs: list[subprocess.Popen] = []
    try:
        # guard (and the same guard exporting its own metrics)
        variants = [("guard", POLICY)]
        if args.metrics:
            variants.append(("guard_metrics", POLICY + METRICS_POLICY))
        for name, policy in variants:
            with tempfile.TemporaryDirectory() as tmp:
                cfg = Path(tmp) / "guard.yaml"
                cfg.write_text(policy)
                guard, port = start_guard(str(cfg))
                procs.append(guard)
                results.append(
                    measure(
                        name,
                        guard.pid,
                        f"127.0.0.1:{port}",
                        payloads,
                        args.requests,
                        args.concurrency,
                        pre=_register_runs,
                    )
                )
                guard.terminate()
                guard.wait(20)
        floor, fport = start_floor(procs)
        results.append(
            measure(
                "floor", floor.pid, f"127.0.0.1:{fport}", payloads, args.requests, args.concurrency
            )
        )
        if not args.no_rotel:
            rotel = start_rotel(procs, f"http://127.0.0.1:{fport}", gzip=True)
            if isinstance(rotel, dict):
                results.append(rotel)
            else:
                proc, port = rotel
                results.append(
                    measure(
                        "rotel", proc.pid, f"127.0.0.1:{port}", payloads, args.requests,
                        args.concurrency,
                    )
                )  # fmt: skip
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    by = {r["receiver"]: r for r in results}
    g, f = by["guard"]["spans_per_s_per_core"], by["floor"]["spans_per_s_per_core"]
    out = {
        "benchmark": "ingest",
        "load": "simple",
        "numbered": args.numbered,
        "cores": os.cpu_count(),
        "request_spans": STEPS_PER_REQUEST * 4,
        "live_runs": RUNS,
        "results": results,
        "guard_vs_floor": round(g / f, 3) if g and f else None,
        "goals": {"spans_per_s_per_core": 100_000, "vs_floor": 0.25},
    }
    if "guard_metrics" in by:
        out["metrics_vs_plain"] = round(by["guard_metrics"]["spans_per_s_per_core"] / g, 3)
    if "rotel" in by and by["rotel"].get("spans_per_s_per_core"):
        out["guard_vs_rotel"] = round(g / by["rotel"]["spans_per_s_per_core"], 3)
    return out


if __name__ == "__main__":
    main()
