"""Garbage-collector pauses bounded for a long-running guard process.

A full (generation 2) collection scans every tracked object: with ten thousand live runs it
held the event loop for 40 to 110 ms at a time (measured under benchmarks/bench_isolation.py's
flood), longer than any message. The guard's run state is freed by reference counting (it
holds no cycles), so the collector is only needed for the short-lived cycles of grpc and
asyncio, which the young generations catch. :func:`bound_gc_pauses` freezes what survives a
full collection (``gc.freeze``: moved to a permanent generation the collector never scans; it
is still freed by reference counting), so each full collection scans only what was allocated
since the previous one. The cost: a cycle frozen while it was alive is collected only by
:func:`reclaim_frozen` (once ingest is quiet after a burst).

It also raises the young generation's threshold from 700 to :data:`YOUNG_THRESHOLD`
allocations: every span allocates its observation (a list, tracked by the collector), so with
the default a young collection ran every few hundred spans; fewer, larger ones cost 5 to 8%
less CPU on the span path (measured in-process on benchmarks/bench_ingest.py's load), and one
of them scans at most that many young objects (well under a millisecond).

Under overload the trade goes the other way. When span requests are being shed, the young
generation fills with what a flood leaves alive (the count the collector keeps is allocations
minus deallocations of any generation, so while old runs are freed as new ones come, a young
collection finds far more than 10,000 objects): 30 to 50 ms a collection, measured under
benchmarks/bench_flood.py, and each one holds every control message behind it.
:func:`overloaded` (the span intake calls it when it sheds, and again once ingest is quiet)
collects every :data:`OVERLOAD_YOUNG_THRESHOLD` allocations meanwhile: under 10 ms each,
for about a tenth more CPU on the span path, which only costs while load is being shed.

Process-wide, so only the process owner (``otel-guard serve``) calls :func:`bound_gc_pauses`;
:func:`overloaded` changes nothing until it has.
"""

from __future__ import annotations

import gc
from typing import Any

__all__ = [
    "OVERLOAD_YOUNG_THRESHOLD",
    "YOUNG_THRESHOLD",
    "bound_gc_pauses",
    "overloaded",
    "reclaim_frozen",
]

YOUNG_THRESHOLD = 10_000
OVERLOAD_YOUNG_THRESHOLD = 1_000
_bounded = False  # bound_gc_pauses ran: this process owns the collector's settings


def _freeze_survivors(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop" and info.get("generation") == 2:
        gc.freeze()


def bound_gc_pauses() -> None:
    """Freeze what exists now and, from then on, what survives each full collection; collect
    the young generation every :data:`YOUNG_THRESHOLD` allocations."""
    global _bounded
    _bounded = True
    gc.collect()
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    if _freeze_survivors not in gc.callbacks:
        gc.callbacks.append(_freeze_survivors)


def overloaded(on: bool) -> None:
    """Small, frequent young collections while span load is shed (``on``), the usual ones
    again once it is quiet. A no-op in a process that did not call :func:`bound_gc_pauses`."""
    if not _bounded:
        return
    young = OVERLOAD_YOUNG_THRESHOLD if on else YOUNG_THRESHOLD
    threshold = gc.get_threshold()
    if threshold[0] != young:
        gc.set_threshold(young, *threshold[1:])


def reclaim_frozen() -> int:
    """Collect what froze while alive and died since: a cycle alive at a full collection
    (a request's frame and the exception it raised, holding the request's body) is frozen
    with the survivors and would otherwise never be freed (after a flood: 10,000 objects,
    50 to 130 MB). One full collection of everything, so only when ingest is quiet (the span
    intake calls it after a burst). Returns the objects collected; 0 in a process that did
    not call :func:`bound_gc_pauses`."""
    if not _bounded:
        return 0
    gc.unfreeze()
    try:
        return gc.collect()
    finally:
        gc.freeze()
