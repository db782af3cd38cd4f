"""OTLP/HTTP receiver throughput against the gRPC receiver, on the same load in the same run.

Three fresh ``otel-guard serve`` processes (``bench_ingest``'s policy: run limits, loop
detection, forecast, tenant windows), one at a time, each with 256 runs registered over a real
control stream, get the same pre-serialised 512-span requests (``bench_ingest.build_requests``):

* ``grpc``: OTLP/gRPC Export on the gRPC port (the baseline);
* ``http_protobuf``: ``POST /v1/traces`` with ``application/x-protobuf`` bodies;
* ``http_gzip``: the same bodies gzipped (``Content-Encoding: gzip``; compressed once, ahead);
* ``http_json``: the same requests as OTLP/JSON (``application/json``, hex ids).

spans/s/core = spans sent / CPU seconds of the guard process (``bench_ingest.measure_load``).
Prints JSON with each HTTP variant's ratio to gRPC.

    python benchmarks/bench_http_ingest.py [--requests 200] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from _net import free_port, wait_port  # benchmarks/ is on sys.path when run as a script
from bench_ingest import (
    POLICY,
    RUNS,
    STEPS_PER_REQUEST,
    _register_runs,
    build_requests,
    measure,
    measure_load,
)
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp

SPANS_PER_REQUEST = STEPS_PER_REQUEST * 4


def to_otlp_json(payload: bytes) -> bytes:
    """The OTLP/JSON form of one request: the proto3 JSON mapping with hex ids."""
    msg = otlp.ExportTraceServiceRequest.FromString(payload)
    doc = json_format.MessageToDict(msg)
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for sp in ss.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in sp:
                        sp[key] = base64.b64decode(sp[key]).hex()
    return json.dumps(doc).encode()


def start(policy: Path) -> tuple[subprocess.Popen, int, int]:
    """``otel-guard serve`` (no store) with gRPC and HTTP on free loopback ports."""
    port, http_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "guard.cli", "serve", "--listen", f"127.0.0.1:{port}"]
    cmd += ["--http-listen", f"127.0.0.1:{http_port}", "--no-store", "--config", str(policy)]
    proc = subprocess.Popen([*cmd, "--log-level", "WARNING"], stdout=subprocess.DEVNULL)
    wait_port(port, proc)
    wait_port(http_port, proc)
    return proc, port, http_port


async def _drive_http(url: str, bodies: list[bytes], headers: dict, n: int, conc: int) -> float:
    counter = iter(range(n))
    connector = aiohttp.TCPConnector(limit=conc)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def post(body: bytes) -> None:
            async with session.post(url, data=body, headers=headers) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"HTTP {resp.status}: {(await resp.read())[:200]!r}")

        async def worker() -> None:
            for i in counter:
                await post(bodies[i % len(bodies)])

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conc)))
        return time.perf_counter() - t0


def measure_http(name: str, pid: int, address: str, http_port: int, bodies, headers, n, conc):
    """``bench_ingest.measure_load`` over HTTP: 256 runs registered over a control stream,
    a warm-up of 4 requests, then ``n`` POSTs with ``conc`` in flight."""
    url = f"http://127.0.0.1:{http_port}/v1/traces"

    async def close(kept) -> None:
        kept[1][1].put_nowait(None)
        await kept[0].close()

    return measure_load(
        name,
        pid,
        n * SPANS_PER_REQUEST,
        lambda kept: _drive_http(url, bodies, headers, n, conc),
        pre=lambda: _register_runs(address),
        warm=lambda kept: _drive_http(url, bodies, headers, 4, conc),
        post=close,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--json-requests", type=int, default=20, help="JSON is ~20x slower")
    args = parser.parse_args()
    payloads = build_requests()
    zipped = [gzip.compress(p, compresslevel=6) for p in payloads]
    pb = {"Content-Type": "application/x-protobuf"}
    variants = [
        ("grpc", None, None),
        ("http_protobuf", payloads, pb),
        ("http_gzip", zipped, {**pb, "Content-Encoding": "gzip"}),
        ("http_json", [to_otlp_json(p) for p in payloads], {"Content-Type": "application/json"}),
    ]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "guard.yaml"
        cfg.write_text(POLICY)
        for name, bodies, headers in variants:
            proc, port, http_port = start(cfg)
            try:
                address = f"127.0.0.1:{port}"
                if bodies is None:
                    r = measure(
                        name, proc.pid, address, payloads, args.requests, args.concurrency,
                        pre=_register_runs,
                    )  # fmt: skip
                else:
                    n = args.json_requests if name == "http_json" else args.requests
                    r = measure_http(
                        name, proc.pid, address, http_port, bodies, headers, n, args.concurrency
                    )
                results.append(r)
            finally:
                proc.terminate()
                proc.wait(20)
    by = {r["receiver"]: r["spans_per_s_per_core"] for r in results}
    base = by["grpc"]
    out = {
        "benchmark": "http_ingest",
        "cores": os.cpu_count(),
        "request_spans": SPANS_PER_REQUEST,
        "request_bytes_mean": round(sum(map(len, payloads)) / len(payloads)),
        "gzip_bytes_mean": round(sum(map(len, zipped)) / len(zipped)),
        "live_runs": RUNS,
        "requests": args.requests,
        "concurrency": args.concurrency,
        "results": results,
        "http_protobuf_vs_grpc": round(by["http_protobuf"] / base, 3) if base else None,
        "http_gzip_vs_grpc": round(by["http_gzip"] / base, 3) if base else None,
        "http_json_vs_grpc": round(by["http_json"] / base, 3) if base else None,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
