"""Garbage-collector pauses bounded for a long-running guard process.

A full (generation 2) collection scans every tracked object: with ten thousand live runs it
held the event loop for 40 to 110 ms at a time (measured under benchmarks/bench_isolation.py's
flood), longer than any message. The guard's run state is freed by reference counting (it
holds no cycles), so the collector is only needed for the short-lived cycles of grpc and
asyncio, which the young generations catch. :func:`bound_gc_pauses` freezes what survives a
full collection (``gc.freeze``: moved to a permanent generation the collector never scans; it
is still freed by reference counting), so each full collection scans only what was allocated
since the previous one. The cost: a cycle among frozen objects is never collected.

Process-wide, so only the process owner (``otel-guard serve``) calls it.
"""

from __future__ import annotations

import gc
from typing import Any

__all__ = ["bound_gc_pauses"]


def _freeze_survivors(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop" and info.get("generation") == 2:
        gc.freeze()


def bound_gc_pauses() -> None:
    """Freeze what exists now and, from then on, what survives each full collection."""
    gc.collect()
    gc.freeze()
    if _freeze_survivors not in gc.callbacks:
        gc.callbacks.append(_freeze_survivors)
