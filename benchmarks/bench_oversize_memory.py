"""The guard's resident memory around oversize control messages (8 MB run ids).

A guard runs in a subprocess (``GuardServer``, no store); after a warm-up of ordinary control
streams its RSS is the baseline. Then N control streams each send a Hello, a RunStarted whose
run id is ``--mb`` MB (over the control stream's size limit), and a good RunStarted; the
RSS right after them (peak) and ``--settle-s`` later (after) are read with psutil. Prints
JSON. ``--no-trim`` disables the guard's ``malloc_trim`` after large refusals and
``--no-tune`` its fixed mmap threshold (``guard.server.runtime._memtrim``), to show what the
allocator keeps without them. ``--src DIR`` runs the guard from another source tree (e.g.
an export of an older commit) to compare.

    python benchmarks/bench_oversize_memory.py [--messages 30] [--mb 8] [--no-trim] [--no-tune]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import grpc
import psutil

from guard.v1 import guard_pb2 as pb
from guard.v1 import guard_pb2_grpc

GUARD = r"""
import asyncio, os, sys
try:
    import guard.server.runtime._memtrim as memtrim
    if os.environ.get("BENCH_NO_TRIM"):
        memtrim.after_refusal = lambda size, now=None: False
    if os.environ.get("BENCH_NO_TUNE"):
        memtrim.tune_allocator = lambda: False
except ImportError:  # an older tree has neither
    pass
from guard.policy import PolicyConfig
from guard.server import GuardServer, NullSink

async def main():
    cfg = PolicyConfig.from_dict(None)
    async with GuardServer(cfg, listen="127.0.0.1:0", sink=NullSink()) as srv:
        print(srv.port, flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""


@contextlib.contextmanager
def guard_process(
    *, trim: bool = True, tune: bool = True, src: str | None = None
) -> Iterator[tuple[int, Any]]:
    """A guard subprocess on 127.0.0.1:0: yields (port, psutil.Process)."""
    env = dict(os.environ)
    if not trim:
        env["BENCH_NO_TRIM"] = "1"
    if not tune:
        env["BENCH_NO_TUNE"] = "1"
    if src:
        env["PYTHONPATH"] = src
    proc = subprocess.Popen(
        [sys.executable, "-c", GUARD],
        stdout=subprocess.PIPE,
        env=env,
        cwd=src or None,
        text=True,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.strip():
            raise RuntimeError("the guard subprocess did not start")
        yield int(line), psutil.Process(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _started(run_id: str, request_id: int) -> pb.AgentMessage:
    rs = pb.RunStarted(run_id=run_id, tenant="acme", request_id=request_id)
    return pb.AgentMessage(run_started=rs)


async def one_stream(address: str, i: int, big_bytes: int) -> str:
    """Hello, a RunStarted with a ``big_bytes`` run id (none if 0), a good RunStarted; then
    close. ``admitted`` when the good run was admitted on the same stream, else the status
    the stream ended with."""
    async with grpc.aio.insecure_channel(address) as ch:
        outbox: asyncio.Queue[Any] = asyncio.Queue()

        async def requests() -> Any:
            while (msg := await outbox.get()) is not None:
                yield msg

        call = guard_pb2_grpc.GuardControlStub(ch).Attach(requests())
        hello = pb.Hello(process_id=f"bench-{i}", tenant="acme")
        await outbox.put(pb.AgentMessage(hello=hello))
        if big_bytes:
            await outbox.put(_started("x" * big_bytes, 1))
        await outbox.put(_started(f"good-{i}", 2))
        result = "ended"
        try:
            async for msg in call:
                if msg.WhichOneof("body") == "admit" and msg.admit.request_id == 2:
                    result = "admitted"
                    break
        except grpc.aio.AioRpcError as exc:
            result = exc.code().name
        await outbox.put(None)
        call.cancel()
        return result


def rss_mb(p: Any) -> float:
    return p.memory_info().rss / 1e6


def measure(
    messages: int = 30,
    mb: float = 8.0,
    trim: bool = True,
    settle_s: float = 3.0,
    src: str | None = None,
    tune: bool = True,
) -> dict[str, Any]:
    """The figures of one guard subprocess (see the module docstring)."""
    big = int(mb * 1_000_000)
    with guard_process(trim=trim, tune=tune, src=src) as (port, p):
        address = f"127.0.0.1:{port}"

        async def drive(n: int, size: int, base: int) -> list[str]:
            return [await one_stream(address, base + i, size) for i in range(n)]

        asyncio.run(drive(5, 0, 0))  # warm-up: streams, runs, the code paths
        time.sleep(0.5)
        gc.collect()
        baseline = rss_mb(p)
        t0 = time.monotonic()
        results = asyncio.run(drive(messages, big, 100))
        took = time.monotonic() - t0
        peak = rss_mb(p)
        time.sleep(settle_s)
        after = rss_mb(p)
    return {
        "messages": messages,
        "run_id_mb": mb,
        "trim": trim,
        "tune": tune,
        "src": src or "this tree",
        "rss_baseline_mb": round(baseline, 1),
        "rss_peak_mb": round(peak, 1),
        "rss_after_mb": round(after, 1),
        "rss_growth_after_mb": round(after - baseline, 1),
        "streams_going_on": results.count("admitted"),
        "stream_results": sorted(set(results)),
        "seconds": round(took, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=30)
    ap.add_argument("--mb", type=float, default=8.0)
    ap.add_argument("--settle-s", type=float, default=3.0)
    ap.add_argument("--no-trim", action="store_true", help="no malloc_trim after refusals")
    ap.add_argument("--no-tune", action="store_true", help="glibc's dynamic mmap threshold")
    ap.add_argument("--src", default=None, help="run the guard from this source tree")
    args = ap.parse_args()
    out = measure(
        args.messages, args.mb, not args.no_trim, args.settle_s, args.src, not args.no_tune
    )
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
