"""``bench_ingest.py --load simple``: the load of the earlier issues, kept so their figures can
be compared (see ``bench_ingest``'s docstring). Its synthetic requests (:func:`build_requests`)
and run registration (:func:`register_runs`) also serve ``bench_redis_ingest``,
``bench_replicas_scaling`` and ``bench_http_ingest``, through ``bench_ingest``."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

import grpc
from _measure import drive, measure_load
from _net import start_guard
from _receivers import start_floor, start_rotel
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

__all__ = [
    "METRICS_POLICY",
    "POLICY",
    "RUNS",
    "STEPS_PER_REQUEST",
    "build_requests",
    "measure",
    "register_runs",
    "simple",
    "tenant_of",
]

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


async def register_runs(address: str, tenants: int = 1) -> tuple[object, object]:
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
                        pre=register_runs,
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
