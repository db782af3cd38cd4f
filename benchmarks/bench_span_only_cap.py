"""New implicit runs at ``max_tracked_runs``: the cost of making room, by tracked runs.

In-process (a ``Registry``, no network): the guard is filled to its cap with span-only runs
of one tenant (and a few of another's, which must survive), then 512-span requests, each
span naming a new run id of the flooding tenant, are applied; each new run takes the place
of the tenant's stalest. Reports the milliseconds per request and per span at each size:
with the per-tenant LRU they stay flat as the table grows. Prints JSON.

    python benchmarks/bench_span_only_cap.py [--sizes 1000,10000,100000] [--requests 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from guard.policy import PolicyConfig
from guard.server import MemorySink, decode_request
from guard.server.runs._registry import Registry
from guard.server.runtime._auth import Principal

BATCH = 512


def _kv(key: str, value: str | int) -> common_pb2.KeyValue:
    v = common_pb2.AnyValue(int_value=value) if isinstance(value, int) else None
    v = v or common_pb2.AnyValue(string_value=value)
    return common_pb2.KeyValue(key=key, value=v)


def _request(prefix: str, lo: int, hi: int) -> bytes:
    spans = [
        trace_pb2.Span(
            name="chat gpt-4.1",
            trace_id=(1 << 100 | i).to_bytes(16, "big"),
            span_id=(i + 1).to_bytes(8, "big"),
            attributes=[
                _kv("gen_ai.operation.name", "chat"),
                _kv("gen_ai.request.model", "gpt-4.1"),
                _kv("gen_ai.usage.input_tokens", 10),
                _kv("gen_ai.usage.output_tokens", 1),
                _kv("guard.run.id", f"{prefix}-{i}"),
            ],
        )
        for i in range(lo, hi)
    ]
    req = otlp.ExportTraceServiceRequest(resource_spans=[{"scope_spans": [{"spans": spans}]}])
    return req.SerializeToString()


def measure(size: int, requests: int) -> dict[str, float]:
    """Milliseconds per 512-span request of new run ids at a cap of ``size`` runs."""
    cfg = PolicyConfig.from_dict({"guard": {"max_tracked_runs": size}})
    reg = Registry(cfg, MemorySink(), guard_id="bench")
    flood, other = Principal(tenant="flood", admin=False), Principal(tenant="other", admin=False)
    reg.ingest(
        decode_request(otlp.ExportTraceServiceRequest.FromString(_request("o", 0, 8))), other
    )
    for lo in range(0, size, BATCH):
        data = _request("f", lo, min(lo + BATCH, size))
        reg.ingest(decode_request(otlp.ExportTraceServiceRequest.FromString(data)), flood)
    times = []
    for r in range(requests):
        lo = size + r * BATCH
        req = otlp.ExportTraceServiceRequest.FromString(_request("f", lo, lo + BATCH))
        decoded = decode_request(req)
        t0 = time.perf_counter()
        reg.ingest(decoded, flood)
        times.append((time.perf_counter() - t0) * 1000)
    assert len(reg.runs) == size
    ms = statistics.median(times)
    kept = sum(f"o-{i}" in reg.runs for i in range(8))  # the other tenant's: all 8 expected
    return {
        "tracked_runs": size,
        "ms_per_request": round(ms, 3),
        "us_per_span": round(ms * 1000 / BATCH, 2),
        "other_tenant_runs_kept": kept,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--requests", type=int, default=10)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(json.dumps({"span_only_cap": [measure(n, args.requests) for n in sizes]}, indent=2))


if __name__ == "__main__":
    main()
