"""Bytes per live run in the guard's registry (tracemalloc over N registered runs).

Each run is admitted through the real ``Registry.register`` path and then receives one step
of spans (a model call, two tool calls, a step end), so the loop rings, forecaster, budget
and the trace/tenant indexes are all populated. Prints JSON. Goal: <= 4096 bytes per run.

    python benchmarks/bench_memory.py [--runs 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import tracemalloc

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from guard.policy import PolicyConfig
from guard.server import NullSink, decode_request
from guard.server.control._fanout import AgentSession
from guard.server.runs._registry import Registry
from guard.server.runtime._auth import ANONYMOUS
from guard.v1 import guard_pb2 as pb


def _kv(k, v):
    a = common_pb2.AnyValue()
    if isinstance(v, int):
        a.int_value = v
    else:
        a.string_value = v
    return common_pb2.KeyValue(key=k, value=a)


def _spans(run_id: str, tid: bytes) -> otlp.ExportTraceServiceRequest:
    spans = [
        trace_pb2.Span(
            name="chat gpt-4.1",
            trace_id=tid,
            span_id=b"\x02" * 8,
            attributes=[
                _kv("guard.run.id", run_id),
                _kv("gen_ai.operation.name", "chat"),
                _kv("gen_ai.request.model", "gpt-4.1"),
                _kv("gen_ai.usage.input_tokens", 1200),
                _kv("gen_ai.usage.output_tokens", 80),
            ],
        ),
        *(
            trace_pb2.Span(
                name="execute_tool search",
                trace_id=tid,
                span_id=bytes([3 + i]) * 8,
                attributes=[
                    _kv("guard.run.id", run_id),
                    _kv("gen_ai.operation.name", "execute_tool"),
                    _kv("gen_ai.tool.name", "search"),
                    _kv("guard.action.fingerprint", f"{(i + 1) * 0x9E3779B97F4A7C15:032x}"[-32:]),
                    _kv("guard.result.hash", f"{(i + 7) * 0x9E3779B97F4A7C15:032x}"[-32:]),
                ],
            )
            for i in range(2)
        ),
        trace_pb2.Span(
            name="guard.step",
            trace_id=tid,
            span_id=b"\x09" * 8,
            attributes=[_kv("guard.run.id", run_id), _kv("guard.step.index", 1)],
        ),
    ]
    return otlp.ExportTraceServiceRequest(resource_spans=[{"scope_spans": [{"spans": spans}]}])


async def measure(n: int) -> dict:
    config = PolicyConfig.from_dict(
        {"runs": {"max_steps": 50, "max_tokens": 200_000, "max_cost_usd": 5.0}}
    )
    registry = Registry(config, NullSink(), guard_id="bench")
    session = AgentSession("s", None, registry.log, registry.clock)
    registry.hello(session, pb.Hello(process_id="p", tenant="acme"), ANONYMOUS)
    # inputs are built before measuring: they are the wire's memory, not the registry's
    starts = [
        pb.RunStarted(run_id=f"run-{i:08d}", trace_id=f"{i:032x}", tenant="acme", agent="bot")
        for i in range(n)
    ]
    batches = [decode_request(_spans(f"run-{i:08d}", i.to_bytes(16, "big"))) for i in range(n)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for rs, decoded in zip(starts, batches, strict=True):
        registry.register(session, rs, ANONYMOUS)
        registry.ingest(decoded, ANONYMOUS)
        while not session.queue.empty():  # the admit messages are in flight, not state
            session.queue.get_nowait()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    snapshot = tracemalloc.take_snapshot()
    tracemalloc.stop()
    top = [
        {"where": str(s.traceback[0]), "bytes_per_run": round(s.size / n, 1)}
        for s in snapshot.statistics("lineno")[:8]
    ]
    per_run = (after - before) / n
    assert len(registry.runs) == n
    return {
        "benchmark": "memory_per_live_run",
        "runs": n,
        "bytes_per_run": round(per_run, 1),
        "goal_bytes_per_run": 4096,
        "meets_goal": per_run <= 4096,
        "top_allocations": top,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10_000)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.runs)), indent=2))


if __name__ == "__main__":
    main()
