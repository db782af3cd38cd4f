"""How the ingest benchmarks measure (``bench_ingest.py`` and the scripts built on it): the
CPU seconds of a receiving process, Export requests driven with a number in flight, and one
timed phase as spans per CPU-second."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import grpc

__all__ = ["EXPORT", "cpu_seconds", "drive", "measure_load"]

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


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
