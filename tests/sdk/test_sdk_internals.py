"""Building blocks: the shared timer thread, the low-latency processor, NullRun, tool batches."""

from __future__ import annotations

import threading

import pytest
from _wait import wait_until
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult

import guard
from guard.sdk import _timers
from guard.sdk._export import LowLatencySpanProcessor
from guard.testing import SpanSink


def test_timers_fire_in_order_and_cancel() -> None:
    fired: list[str] = []
    done = threading.Event()
    _timers.schedule(0.05, lambda: fired.append("b"))
    t = _timers.schedule(0.02, lambda: fired.append("never"))
    _timers.schedule(0.01, lambda: fired.append("a"))
    _timers.schedule(0.08, done.set)
    t.cancel()
    assert done.wait(5)
    assert fired == ["a", "b"]


def test_dead_timers_are_compacted() -> None:
    sched = _timers._Scheduler()
    timers = [sched.schedule(3600, lambda: None) for _ in range(3000)]
    for t in timers:
        t.cancel()
    sched.schedule(3600, lambda: None)
    # compacted in one pass by schedule(), or popped by the timer thread meanwhile
    wait_until(lambda: len(sched._heap) < 100, 10, lambda: f"compaction ({len(sched._heap)} left)")


class _SlowExporter:
    def __init__(self) -> None:
        self.batches: list[int] = []
        self.gate = threading.Event()
        self.exporting = threading.Event()  # set once the worker is inside export()

    def export(self, spans):
        self.exporting.set()
        self.gate.wait(5)
        self.batches.append(len(spans))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def test_low_latency_processor_batches_what_is_queued_and_counts_drops() -> None:
    exporter = _SlowExporter()
    proc = LowLatencySpanProcessor(exporter, max_delay_ms=0, queue_size=50)
    provider = TracerProvider()
    provider.add_span_processor(proc)
    tracer = provider.get_tracer("t")
    tracer.start_span("first").end()  # the worker takes it and blocks in export
    assert exporter.exporting.wait(10)
    for i in range(80):
        tracer.start_span(f"s{i}").end()
    exporter.gate.set()
    assert proc.force_flush(5000)
    assert proc.dropped == 30 and proc.exported == 51
    assert exporter.batches[0] == 1 and max(exporter.batches[1:]) > 1  # coalesced
    provider.shutdown()


def test_null_run_outside_a_run_is_inert() -> None:
    r = guard.current_run()
    assert not r and r.run_id == "" and not r.cancelled
    assert r.cancel() is False and r.timeout(None) is None
    proc = object()
    assert r.track_process(proc) is proc
    r.pause("x")
    r.resume()
    r.raise_if_cancelled()
    guard.evidence("tests_passed")
    batch = guard.admit_tools([1, 2, 3])
    assert batch.admitted == [1, 2, 3] and batch.complete(["a", "b", "c"]) == ["a", "b", "c"]


def test_sync_batch_with_guard_tool_consumes_reserved_slots(sink: SpanSink) -> None:
    @guard.tool
    def fetch(url: str) -> str:
        return "page"

    @guard.run(agent="a", max_tool_calls=4)
    def f() -> list:
        with guard.step():
            calls = [{"id": f"c{i}", "url": f"https://x/{i}"} for i in range(6)]
            with guard.admit_tools(calls) as batch:
                results = [fetch(c["url"]) for c in batch.admitted]
                return batch.complete(results)

    out = f()
    assert out[:4] == ["page"] * 4
    assert [r["tool_call_id"] for r in out[4:]] == ["c4", "c5"]
    attrs = sink.named("invoke_agent")[0].attributes
    assert attrs["guard.usage.tool_calls"] == 4 and attrs["guard.stop.reason"] == "final_answer"


def test_tool_batch_exceptions_become_error_results(sink: SpanSink) -> None:
    import asyncio

    async def tool(call: dict) -> str:
        if call["id"] == "bad":
            raise RuntimeError("boom")
        return "ok"

    @guard.run(agent="a")
    async def f() -> list:
        return await guard.run_tools([{"id": "good"}, {"id": "bad"}], tool)

    out = asyncio.run(f())
    assert out[0] == "ok"
    assert out[1] == {"tool_call_id": "bad", "is_error": True, "content": "error: RuntimeError"}


def test_on_directive_from_local_soft_thresholds(sink: SpanSink) -> None:
    seen: list = []

    @guard.run(agent="a", max_steps=10)
    def f() -> bool:
        run = guard.current_run()
        run.on_directive(lambda action, reason, detail: seen.append((action, reason)))
        for _ in range(10):
            with guard.step():
                if run.wrap_up_requested:  # told at the start of the step: summarise now
                    return run.warned
        return False

    assert f() is True
    assert seen == [("warn", "max_steps"), ("wrap_up", "max_steps")]


def test_stats_without_endpoint_is_empty_and_flush_is_a_noop() -> None:
    assert guard.stats() == {} or "spans_exported" not in guard.stats()
    assert guard.flush(0.1) is True


@pytest.mark.parametrize("bad", [{"max_tokens": 0}, {"deadline_s": -1.0}, {"max_cost_usd": "x"}])
def test_invalid_limits_are_rejected_at_decoration(bad: dict) -> None:
    with pytest.raises(guard.ConfigError):
        guard.run(**bad)(lambda: None)
