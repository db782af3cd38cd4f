"""Ingest throughput: spans per second per core through the guard, against two baselines.

Three receivers get the same pre-serialised OTLP load (512-span requests of guarded steps:
one model call, two tool calls and a step end per step, across 256 live runs), one at a time:

* ``guard``: ``otel-guard serve`` with full policy (run limits, loop detection, forecast,
  tenant rolling windows and concurrency), runs registered over a real control stream;
* ``floor``: a do-nothing OTLP receiver on the same grpcio (grpc.aio) that parses each
  request and acks it (the decode-only floor);
* ``rotel``: the rotel collector (PyPI ``rotel``) receiving the load and passing it through
  its OTLP exporter to a floor receiver.

spans/s/core = spans sent / CPU seconds (user + system) of the receiving process, read from
its CPU clock (``clock_getcpuclockid``; ``/proc/<pid>/stat`` ticks as the fallback). Prints
JSON. Goals: guard >= 100k spans/s/core and >= 0.25x the floor.

    python benchmarks/bench_ingest.py [--requests 300] [--concurrency 8] [--no-rotel] [--numbered]

``--numbered``: every counted span carries its record number (``guard.seq``), as the SDK's
spans do when it has a control stream. ``--metrics``: also measure a guard with its own metrics
on (``guard.metrics.listen``, a Prometheus endpoint), reported as ``guard_metrics`` with its
ratio to the plain guard of the same run (``metrics_vs_plain``).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from _net import (  # benchmarks/ is on sys.path when run as a script
    free_port,
    start_guard,
    wait_port,
)
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


# -- the floor receiver ------------------------------------------------------------------
async def _floor(port: int) -> None:
    ok = otlp.ExportTraceServiceResponse().SerializeToString()
    parse = otlp.ExportTraceServiceRequest.FromString

    async def export(data: bytes, context: object) -> bytes:
        parse(data)
        return ok

    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "opentelemetry.proto.collector.trace.v1.TraceService",
                {"Export": grpc.unary_unary_rpc_method_handler(export)},
            ),
        )
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


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


async def drive(address: str, payloads: list[bytes], n: int, concurrency: int) -> float:
    channel = grpc.aio.insecure_channel(
        address, options=[("grpc.max_send_message_length", 64 << 20)]
    )
    export = channel.unary_unary(EXPORT)
    counter = iter(range(n))

    async def worker() -> None:
        for i in counter:
            await export(payloads[i % len(payloads)], timeout=60)

    for p in payloads[:2]:  # warm up
        await export(p, timeout=60)
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    await channel.close()
    return wall


def measure(name: str, pid: int, address: str, payloads, n: int, conc: int, pre=None) -> dict:
    async def go() -> tuple[float, float, float]:
        keep = await pre(address) if pre is not None else None
        await drive(address, payloads, 4, conc)  # warm-up through the full path
        c0 = cpu_seconds(pid)
        wall = await drive(address, payloads, n, conc)
        c1 = cpu_seconds(pid)
        if keep is not None:
            keep[1][1].put_nowait(None)
            await keep[0].close()
        return wall, c0, c1

    wall, c0, c1 = asyncio.run(go())
    spans = n * STEPS_PER_REQUEST * 4
    cpu = c1 - c0
    return {
        "receiver": name,
        "spans": spans,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "spans_per_s": round(spans / wall),
        "spans_per_s_per_core": round(spans / cpu) if cpu > 0 else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--no-rotel", action="store_true")
    parser.add_argument("--numbered", action="store_true", help="guard.seq on the spans")
    parser.add_argument("--metrics", action="store_true", help="also a guard with metrics on")
    parser.add_argument("--role", choices=["floor"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "floor":
        asyncio.run(_floor(args.port))
        return

    payloads = build_requests(args.numbered)
    py = sys.executable
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
        # floor
        fport = free_port()
        floor = subprocess.Popen([py, __file__, "--role", "floor", "--port", str(fport)])
        procs.append(floor)
        wait_port(fport, floor)
        results.append(
            measure(
                "floor", floor.pid, f"127.0.0.1:{fport}", payloads, args.requests, args.concurrency
            )
        )
        # rotel -> floor
        if not args.no_rotel:
            results.append(_rotel(payloads, args, fport, procs))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    by = {r["receiver"]: r for r in results}
    g, f = by["guard"]["spans_per_s_per_core"], by["floor"]["spans_per_s_per_core"]
    out = {
        "benchmark": "ingest",
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
    print(json.dumps(out, indent=2))


def _rotel(payloads, args, floor_port: int, procs: list) -> dict:
    try:
        import rotel
    except ImportError:
        return {"receiver": "rotel", "error": "rotel not installed"}
    binary = Path(rotel.__file__).resolve().parent / "rotel-agent"
    port, http = free_port(), free_port()
    pidfile = Path(tempfile.gettempdir()) / f"rotel-bench-{os.getpid()}.pid"
    proc = subprocess.Popen(
        [
            str(binary),
            "start",
            "--otlp-grpc-endpoint",
            f"127.0.0.1:{port}",
            "--otlp-http-endpoint",
            f"127.0.0.1:{http}",
            "--exporter",
            "otlp",
            "--otlp-exporter-endpoint",
            f"http://127.0.0.1:{floor_port}",
            "--otlp-exporter-protocol",
            "grpc",
            "--pid-file",
            str(pidfile),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    procs.append(proc)
    try:
        wait_port(port, proc)
    except RuntimeError as exc:
        return {"receiver": "rotel", "error": str(exc)}
    return measure(
        "rotel", proc.pid, f"127.0.0.1:{port}", payloads, args.requests, args.concurrency
    )


if __name__ == "__main__":
    main()
