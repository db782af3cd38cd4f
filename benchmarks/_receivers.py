"""The baseline receivers of the ingest benchmarks: the decode-only floor and rotel."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc
from _net import free_port, wait_port
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp

__all__ = ["floor_main", "start_floor", "start_rotel"]

INGEST = str(Path(__file__).with_name("bench_ingest.py"))  # its --role floor runs floor_main


async def floor_main(port: int) -> None:
    """A do-nothing OTLP receiver on the same grpcio (grpc.aio): parses each request, acks."""
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


def start_floor(procs: list) -> tuple[subprocess.Popen, int]:
    """The decode-only floor in its own process (it joins ``procs``), and its port."""
    fport = free_port()
    floor = subprocess.Popen([sys.executable, INGEST, "--role", "floor", "--port", str(fport)])
    procs.append(floor)
    wait_port(fport, floor)
    return floor, fport


def start_rotel(procs: list, forward_to: str | None, *, gzip: bool = False):
    """rotel (PyPI ``rotel``) on free loopback ports: into its blackhole exporter
    (``forward_to=None``) or forwarding over OTLP/gRPC to ``forward_to`` (gzip only when
    asked: its default is gzip). Returns (process, gRPC port), or an error entry."""
    try:
        import rotel
    except ImportError:
        return {"receiver": "rotel", "error": "rotel not installed"}
    binary = Path(rotel.__file__).resolve().parent / "rotel-agent"
    port, http = free_port(), free_port()
    pidfile = Path(tempfile.gettempdir()) / f"rotel-bench-{os.getpid()}-{port}.pid"
    cmd = [str(binary), "start", "--otlp-grpc-endpoint", f"127.0.0.1:{port}"]
    cmd += ["--otlp-http-endpoint", f"127.0.0.1:{http}", "--pid-file", str(pidfile)]
    if forward_to is None:
        cmd += ["--exporter", "blackhole"]
    else:
        cmd += ["--exporter", "otlp", "--otlp-exporter-endpoint", forward_to]
        cmd += ["--otlp-exporter-protocol", "grpc"]
        cmd += ["--otlp-exporter-compression", "gzip" if gzip else "none"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(proc)
    try:
        wait_port(port, proc)
    except RuntimeError as exc:
        return {"receiver": "rotel", "error": str(exc)}
    return proc, port
