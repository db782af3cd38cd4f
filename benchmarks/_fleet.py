"""The fleet-shaped ingest load of ``bench_ingest.py --load fleet``.

* The spans are what the real SDK exports: :func:`capture` runs guarded runs (a model call,
  two tool calls and a step end per step, then the run span) in a child process whose span
  exporter points at a recording receiver and whose control stream is held by a real guard,
  so the spans carry their record numbers (``guard.seq``) exactly as in production. The
  captured run is then replayed under fresh run ids, trace ids and span ids
  (:func:`build_fleet`), serialised once, ahead of the timed phases.
* 8 tenants, each with its own bearer token (auth on), a concurrency cap and three rolling
  windows; one control stream per tenant (one agent process each), every run registered
  there (RunStarted -> Allowance + Admit -> Ack), heartbeats with the live runs' usage, and
  ended there (RunEnded -> RecordAck); new runs start throughout: each tenant keeps
  :data:`LIVE_PER_TENANT` runs live and replaces each one that ends.
* Every request holds one tenant's spans (its token) from its live runs, interleaved step by
  step as their agents export them. A run is registered (and admitted) before the first
  request that carries its spans is sent, and ended once every request carrying its spans
  is acknowledged, as the SDK does (its run span is exported before its RunEnded).

:func:`_fleet_control.drive_fleet` with ``export=False`` replays the same control traffic (same runs, same
heartbeats, same ends, with other run ids) without the spans: the control-path phase
(``_fleet_control``).
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.proto.trace.v1 import trace_pb2

__all__ = [
    "TENANTS",
    "FleetLoad",
    "auth_metadata",
    "build_fleet",
    "capture",
    "capture_main",
    "fleet_env",
    "fleet_policy",
    "run_id",
    "trace_of",
]

TENANTS = 8
LIVE_PER_TENANT = 32  # 256 live runs in all
STEPS_PER_RUN = 10
REQUEST_SPANS = 512


def fleet_policy() -> str:
    """The guard's policy: full run limits, 8 tenants with a cap and three rolling windows,
    bearer tokens bound to tenants (read from :func:`fleet_env`)."""
    lines = [
        "runs:",
        "  max_steps: 1000000000",
        "  max_tokens: 1000000000000",
        "  max_cost_usd: 1000000000.0",
        "  deadline_s: 36000",
        "auth:",
        "  admin_token_env: BENCH_ADMIN_TOKEN",
        "  tenants:",
    ]
    lines += [f"    t{t}: {{token_env: BENCH_TOKEN_T{t}}}" for t in range(TENANTS)]
    lines.append("tenants:")
    for t in range(TENANTS):
        lines += [
            f"  t{t}:",
            "    max_concurrent_runs: 100000",
            "    rolling:",
            "      - {metric: cost_usd, limit: 1000000000000.0, window_s: 3600}",
            "      - {metric: tokens, limit: 1000000000000000.0, window_s: 60}",
            "      - {metric: runs, limit: 1000000000000.0, window_s: 86400}",
        ]
    return "\n".join(lines) + "\n"


def token_of(tenant: int) -> str:
    return f"bench-token-{tenant}-" + hashlib.sha256(str(tenant).encode()).hexdigest()[:16]


def fleet_env() -> dict[str, str]:
    env = dict(os.environ, BENCH_ADMIN_TOKEN="bench-admin")
    env.update({f"BENCH_TOKEN_T{t}": token_of(t) for t in range(TENANTS)})
    return env


def auth_metadata(tenant: int) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token_of(tenant)}"),)


# -- capturing what the SDK exports ------------------------------------------------------
def capture_main(guard_address: str, out_path: str, steps: int) -> None:
    """Child process: one guarded run of ``steps`` steps through the real SDK; the Export
    request bodies its span exporter sent are written to ``out_path`` (length-prefixed)."""
    from concurrent import futures

    import guard

    bodies: list[bytes] = []
    ok = otlp.ExportTraceServiceResponse().SerializeToString()

    def export(body: bytes, context: Any) -> bytes:
        bodies.append(body)
        return ok

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "opentelemetry.proto.collector.trace.v1.TraceService",
                {"Export": grpc.unary_unary_rpc_method_handler(export)},
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    guard.configure(
        endpoint=guard_address,
        span_endpoint=f"127.0.0.1:{port}",
        tenant="t0",
        token=token_of(0),
        hmac_key="bench-hmac-key",
    )

    @guard.run(agent="fleet-bench", max_steps=steps + 5)
    def agent() -> str:
        for i in range(steps):
            with guard.step() as step:
                step.model_call(model="gpt-4.1", input_tokens=1200 + 7 * i, output_tokens=90)
                step.tool_call("search", {"q": f"refund {i}", "lang": "en"}, result=f"doc {i}")
                step.tool_call("lookup", {"order": 1000 + i}, result={"state": i % 3})
                step.progress(True)
        return "done"

    agent()
    guard.shutdown()
    server.stop(None)
    Path(out_path).write_bytes(b"".join(len(b).to_bytes(4, "big") + b for b in bodies))


def capture(guard_address: str, tmp: str, steps: int = STEPS_PER_RUN) -> list[bytes]:
    """The Export bodies of one real SDK run (see :func:`capture_main`), from a child."""
    import subprocess

    out = os.path.join(tmp, "captured.bin")
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_ingest.py")
    cmd = [sys.executable, here, "--role", "capture", "--address", guard_address]
    subprocess.run([*cmd, "--out", out, "--steps", str(steps)], check=True, timeout=120)
    data, bodies = Path(out).read_bytes(), []
    while data:
        n = int.from_bytes(data[:4], "big")
        bodies.append(data[4 : 4 + n])
        data = data[4 + n :]
    if not bodies:
        raise RuntimeError("the SDK exported no spans")
    return bodies


# -- the load -----------------------------------------------------------------------------
@dataclass
class FleetLoad:
    """The requests (bytes, tenant) and, per request, the runs whose spans it carries."""

    payloads: list[bytes]
    tenants: list[int]
    runs_of: list[list[int]]  # request -> run numbers
    tenant_of_run: dict[int, int]
    spans: int
    template_spans: int
    span_names: list[str] = field(default_factory=list)

    @property
    def runs(self) -> int:
        return len(self.tenant_of_run)


def run_id(prefix: str, k: int) -> str:
    return f"{prefix}-run-{k:07d}"


def trace_of(prefix: str, k: int) -> bytes:
    return hashlib.md5(f"{prefix}:{k}".encode()).digest()


def _template(bodies: Iterable[bytes]) -> tuple[Any, Any, list[trace_pb2.Span]]:
    resource = scope = None
    spans: list[trace_pb2.Span] = []
    for b in bodies:
        req = otlp.ExportTraceServiceRequest.FromString(b)
        for rs in req.resource_spans:
            resource = rs.resource
            for ss in rs.scope_spans:
                scope = scope or ss.scope
                spans.extend(ss.spans)
    return resource, scope, spans


def _chunks(spans: list[trace_pb2.Span]) -> list[list[trace_pb2.Span]]:
    """The export order cut after each step span: the spans an agent exports per step."""
    out: list[list[trace_pb2.Span]] = [[]]
    for s in spans:
        out[-1].append(s)
        if s.name == "guard.step":
            out.append([])
    return [c for c in out if c]


def _fresh(span: trace_pb2.Span, prefix: str, k: int, tenant: int, template_run: str):
    s = trace_pb2.Span()
    s.CopyFrom(span)
    s.trace_id = trace_of(prefix, k)
    salt = f"{prefix}:{k}:".encode()
    s.span_id = hashlib.md5(salt + span.span_id).digest()[:8]
    if span.parent_span_id:
        s.parent_span_id = hashlib.md5(salt + span.parent_span_id).digest()[:8]
    for kv in s.attributes:
        v = kv.value
        if v.HasField("string_value"):
            if v.string_value == template_run:
                v.string_value = run_id(prefix, k)
            elif kv.key == "guard.tenant":
                v.string_value = f"t{tenant}"
    return s


def build_fleet(bodies: list[bytes], requests: int, prefix: str = "f") -> FleetLoad:
    """``requests`` requests of :data:`REQUEST_SPANS` spans, round-robin over the tenants;
    each tenant's live runs advance one exported step per turn, a run that ended is replaced
    by a new one."""
    resource, scope, spans = _template(bodies)
    template_run = next(
        kv.value.string_value for s in spans for kv in s.attributes if kv.key == "guard.run.id"
    )
    chunks = _chunks(spans)
    next_run = 0
    tenant_of_run: dict[int, int] = {}
    live: list[list[list[int]]] = []  # tenant -> [run number, next chunk]
    for t in range(TENANTS):
        live.append([])
        for _ in range(LIVE_PER_TENANT):
            live[t].append([next_run, 0])
            tenant_of_run[next_run] = t
            next_run += 1
    cursor = [0] * TENANTS
    payloads, tenants, runs_of = [], [], []
    total = 0
    for i in range(requests):
        t = i % TENANTS
        out: list[trace_pb2.Span] = []
        carried: list[int] = []
        while len(out) < REQUEST_SPANS:
            slot = live[t][cursor[t]]
            k, c = slot
            out += [_fresh(s, prefix, k, t, template_run) for s in chunks[c]]
            if not carried or carried[-1] != k:
                carried.append(k)
            slot[1] += 1
            if slot[1] == len(chunks):  # the run's last spans: a new run takes its place
                slot[0], slot[1] = next_run, 0
                tenant_of_run[next_run] = t
                next_run += 1
            cursor[t] = (cursor[t] + 1) % LIVE_PER_TENANT
        req = otlp.ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        rs.resource.CopyFrom(resource)
        ss = rs.scope_spans.add()
        ss.scope.CopyFrom(scope)
        ss.spans.extend(out)
        payloads.append(req.SerializeToString())
        tenants.append(t)
        runs_of.append(sorted(set(carried)))
        total += len(out)
    used = {k for ks in runs_of for k in ks}
    return FleetLoad(
        payloads,
        tenants,
        runs_of,
        {k: t for k, t in tenant_of_run.items() if k in used},
        total,
        len(spans),
        sorted({s.name for s in spans}),
    )
