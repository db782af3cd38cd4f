"""Garbage-collector pauses bounded for a long-running guard process.

A full (generation 2) collection scans every tracked object: with ten thousand live runs it
held the event loop for 40 to 110 ms at a time (measured under benchmarks/bench_isolation.py's
flood), longer than any message. The guard's run state is freed by reference counting (it
holds no cycles), so the collector is only needed for the short-lived cycles of grpc and
asyncio, which the young generations catch. :func:`bound_gc_pauses` freezes what survives a
full collection (``gc.freeze``: moved to a permanent generation the collector never scans; it
is still freed by reference counting), so each full collection scans only what was allocated
since the previous one. The cost: a cycle among frozen objects is never collected.

It also raises the young generation's threshold from 700 to :data:`YOUNG_THRESHOLD`
allocations: every span allocates its observation (a list, tracked by the collector), so with
the default a young collection ran every few hundred spans; fewer, larger ones cost 5 to 8%
less CPU on the span path (measured in-process on benchmarks/bench_ingest.py's load), and one
of them scans at most that many young objects (well under a millisecond).

Process-wide, so only the process owner (``otel-guard serve``) calls it.
"""

from __future__ import annotations

import gc
from typing import Any

__all__ = ["YOUNG_THRESHOLD", "bound_gc_pauses"]

YOUNG_THRESHOLD = 10_000


def _freeze_survivors(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop" and info.get("generation") == 2:
        gc.freeze()


def bound_gc_pauses() -> None:
    """Freeze what exists now and, from then on, what survives each full collection; collect
    the young generation every :data:`YOUNG_THRESHOLD` allocations."""
    gc.collect()
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    if _freeze_survivors not in gc.callbacks:
        gc.callbacks.append(_freeze_survivors)
