"""Taking a batch off a control stream's outgoing queue (both ends of ``GuardControl.Attach``).

Part of :mod:`guard.wire` (which re-exports :func:`take_batch` and :func:`take_encoded`). A
batch is bounded by count (:data:`MAX_BATCH_MESSAGES`, the proto's limit) and by size
(:data:`MAX_BATCH_BYTES`, well under the guard's 16 MiB message limit: a backed-up stream full
of heartbeats must not become one message the peer refuses).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from guard._wire_checks import MAX_BATCH_BYTES, MAX_BATCH_MESSAGES

__all__ = ["MAX_BATCH_BYTES", "encode_batch", "take_batch", "take_encoded"]


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


def take_encoded(queue: Any, first: Any, is_end: Callable[[Any], bool]) -> tuple[Any, Any, bool]:
    """:func:`take_batch` of GuardMessages (the same messages, the same bounds), serialized for
    the guard's writer (its serializer passes bytes through: ``_control.add_to_server``): each
    message is serialized once, and several go out as the bytes of one message whose
    ``batch`` field holds them (:func:`encode_batch`), where building that message would copy
    every one of them and serialize them again. Returns ``(payload, carry, closing)``:
    ``payload`` is the bytes to write (``None`` when ``first`` is the end marker), ``carry``
    a message that did not fit, ``closing`` whether the end marker was taken."""
    if is_end(first):
        return None, None, True
    raw = first.SerializeToString()
    parts, size = [raw], len(raw)
    while not queue.empty() and len(parts) < MAX_BATCH_MESSAGES:
        item = queue.get_nowait()
        if is_end(item):
            return (parts[0] if len(parts) == 1 else encode_batch(parts)), None, True
        raw = item.SerializeToString()
        size += len(raw)
        if size > MAX_BATCH_BYTES:
            return (parts[0] if len(parts) == 1 else encode_batch(parts)), item, False
        parts.append(raw)
    return (parts[0] if len(parts) == 1 else encode_batch(parts)), None, False


_BATCH_TAG = b"\x62"  # GuardMessage.batch: field 12, length-delimited
_MESSAGES_TAG = b"\x0a"  # GuardBatch.messages: field 1, length-delimited


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_batch(parts: list[bytes]) -> bytes:
    """The bytes of a GuardMessage whose ``batch`` holds the serialized GuardMessages
    ``parts``, in order: exactly what serializing ``GuardMessage(batch=GuardBatch(messages=
    ...))`` gives."""
    inner = b"".join([_MESSAGES_TAG + _varint(len(p)) + p for p in parts])
    return _BATCH_TAG + _varint(len(inner)) + inner
