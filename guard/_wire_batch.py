"""Taking a batch off a control stream's outgoing queue (both ends of ``GuardControl.Attach``).

Part of :mod:`guard.wire` (which re-exports :func:`take_batch`). A batch is bounded by count
(:data:`MAX_BATCH_MESSAGES`, the proto's limit) and by size (:data:`MAX_BATCH_BYTES`, well
under the guard's 16 MiB message limit: a backed-up stream full of heartbeats must not become
one message the peer refuses).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from guard._wire_checks import MAX_BATCH_BYTES, MAX_BATCH_MESSAGES

__all__ = ["MAX_BATCH_BYTES", "take_batch"]


def take_batch(
    queue: asyncio.Queue[Any], first: Any, is_end: Callable[[Any], bool]
) -> tuple[list[Any], Any]:
    """``first`` and what else ``queue`` holds right now, in order, within the bounds; an end
    marker (``is_end``) is taken last. Returns ``(batch, carry)``: ``carry`` is a message taken
    that did not fit (the first of the next batch), else ``None``."""
    batch = [first]
    if is_end(first):
        return batch, None
    size = first.ByteSize()
    while not queue.empty() and len(batch) < MAX_BATCH_MESSAGES:
        item = queue.get_nowait()
        if is_end(item):
            batch.append(item)
            break
        size += item.ByteSize()
        if size > MAX_BATCH_BYTES:
            return batch, item
        batch.append(item)
    return batch, None
