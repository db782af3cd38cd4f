"""Memory comes back after oversize control messages: a real guard in a subprocess gets 30
control messages with 8 MB run ids (each over the control stream's size limit, refused in
the stream and never parsed) and its RSS returns to within 50 MB of its baseline (the old
code kept ~760 MB of them, and ended each stream). ``benchmarks/bench_oversize_memory.py``
prints the same figures, with and without the allocator remedies."""

from __future__ import annotations

import asyncio
import importlib.util
import platform
from pathlib import Path

import pytest

from guard.server.runtime import _memtrim

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_oversize_memory.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_oversize_memory", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(platform.system() != "Linux", reason="RSS figures of a Linux process")
def test_rss_returns_to_baseline_after_30_oversize_control_messages() -> None:
    pytest.importorskip("psutil")
    figures = _bench().measure(messages=30, mb=8.0, settle_s=3.0)
    assert figures["streams_going_on"] == 30, figures  # each stream went on after its Reject
    assert figures["rss_growth_after_mb"] < 50.0, figures


@pytest.mark.skipif(not _memtrim.available(), reason="glibc only")
def test_the_trim_is_rate_limited_and_only_after_large_refusals(monkeypatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(_memtrim, "_trim", lambda pad: calls.append(pad) or 1)
    monkeypatch.setattr(_memtrim, "_last", -float("inf"))
    assert not _memtrim.after_refusal(_memtrim.TRIM_MIN_BYTES - 1, now=100.0)
    assert _memtrim.after_refusal(8 << 20, now=100.0) and calls == [0]
    assert not _memtrim.after_refusal(8 << 20, now=100.5)  # within the interval
    assert _memtrim.after_refusal(8 << 20, now=101.5) and calls == [0, 0]


@pytest.mark.skipif(not _memtrim.available(), reason="glibc only")
async def test_the_last_refusals_of_a_burst_are_trimmed_too(monkeypatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(_memtrim, "_trim", lambda pad: calls.append(pad) or 1)
    monkeypatch.setattr(_memtrim, "_last", -float("inf"))
    monkeypatch.setattr(_memtrim, "_deferred", False)
    monkeypatch.setattr(_memtrim, "TRIM_INTERVAL_S", 0.05)
    assert _memtrim.after_refusal(8 << 20)
    assert not _memtrim.after_refusal(8 << 20)  # deferred to the interval's end
    assert not _memtrim.after_refusal(8 << 20)  # one deferred trim, not one per refusal
    await asyncio.sleep(0.2)
    assert calls == [0, 0]


def test_the_allocator_is_tuned_on_glibc() -> None:
    assert _memtrim.tune_allocator() is _memtrim.available()
