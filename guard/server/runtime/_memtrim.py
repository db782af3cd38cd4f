"""Give freed heap memory back to the operating system after a large refused message, and
after a burst of span requests.

glibc's allocator serves a large request from ``mmap`` at first, but once such a chunk is
freed it raises its mmap threshold to that size (up to 32 MiB on 64-bit), so the next
requests of that size come from the heap arenas; freed, they stay in the arenas and the
process's RSS does not come down. A client sending oversized control messages (each one
received whole by grpc before the guard can refuse it) would so leave the guard hundreds
of MB larger for good. Two remedies, both only on glibc: :func:`tune_allocator` (once, when
the control service starts) fixes the mmap threshold, so such blocks are unmapped when
freed; :func:`after_refusal` calls ``malloc_trim(0)``, which hands back the free pages
inside the arenas (what smaller blocks leave behind).

:func:`after_refusal` is a no-op unless the refused message was at least
:data:`TRIM_MIN_BYTES`, and the last trim was at least :data:`TRIM_INTERVAL_S` ago (a trim
walks every arena: cheap, but not for every message). :func:`after_burst` is the span
intake's: once ingest goes quiet after a burst (a flood leaves the freed buffers of its
requests in every thread's arena: 160 MB measured), it trims, at most once per interval.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import platform
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = [
    "TRIM_INTERVAL_S",
    "TRIM_MIN_BYTES",
    "after_burst",
    "after_refusal",
    "available",
    "trim",
    "tune_allocator",
]

log = logging.getLogger("guard.server")

TRIM_MIN_BYTES = 1 << 20  # a refusal of a smaller message leaves nothing worth trimming
TRIM_INTERVAL_S = 1.0  # at most one trim per second, however many refusals
# Blocks from this size are mappings of their own, given back when freed: OTLP bodies of a
# few thousand spans (a few hundred KB) included, which a flood otherwise leaves in the arenas
MMAP_THRESHOLD_BYTES = 256 << 10

_lock = threading.Lock()
_last = -float("inf")  # time.monotonic() of the last trim
_trim: Callable[[int], int] | None = None
_loaded = False
stats: dict[str, int] = {"trims": 0}


def _load() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None (musl, macOS, Windows: nothing to call)."""
    global _trim, _loaded
    if _loaded:
        return _trim
    _loaded = True
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc: Any = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    _trim = fn
    return fn


_M_MMAP_THRESHOLD = -3  # mallopt parameter (malloc.h)
_tuned = False


def tune_allocator() -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD_BYTES` (once per process; True when
    set). Left dynamic, the threshold climbs to the largest block freed so far (an 8 MB
    refused message: 8 MB), and from then on such blocks come from a thread's arena, whose
    top ``malloc_trim`` does not give back (it trims only the main arena's top): tens of MB
    stay resident per gRPC thread. Fixed, every block of 256 KiB or more is its own mapping,
    unmapped when freed (the cost, a page fault per page touched, is paid by any new memory
    anyway); it also fixes the trim threshold at its 128 KiB default."""
    global _tuned
    if _tuned:
        return True
    if _load() is None:
        return False
    try:
        libc: Any = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallopt
        fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        _tuned = bool(fn(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False
    return _tuned


def available() -> bool:
    """Whether this process can trim (it runs on glibc)."""
    return _load() is not None


def trim() -> bool:
    """Call ``malloc_trim(0)`` now (no rate limit); True when it ran."""
    fn = _load()
    if fn is None:
        return False
    fn(0)
    stats["trims"] += 1
    return True


def after_refusal(size: int, *, now: float | None = None) -> bool:
    """A message of ``size`` bytes was refused and dropped: trim, when it is big enough, the
    allocator is glibc's and no trim ran in the last :data:`TRIM_INTERVAL_S`. True when it
    trimmed now. Within that interval, one trim is scheduled for its end on the running
    event loop (if any): the last refusals of a burst are trimmed too. Call it once the
    refused message's buffers are released."""
    global _last, _deferred
    if size < TRIM_MIN_BYTES or not available():
        return False
    t = time.monotonic() if now is None else now
    with _lock:
        wait = _last + TRIM_INTERVAL_S - t
        if wait > 0:
            if not _deferred:
                _deferred = _defer(wait)
            return False
        _last = t
    return _safe_trim()


def after_burst() -> bool:
    """A burst of requests is over (the span intake went quiet after many bytes): trim now.
    True when it trimmed. Rare by construction (once per quiet period after a burst), so not
    rate-limited. Safe to call from any thread (it blocks for the trim: call it off the
    event loop)."""
    global _last
    if not available():
        return False
    with _lock:
        _last = time.monotonic()
    return _safe_trim()


_deferred = False  # a trim is scheduled for the end of the current interval


def _defer(delay_s: float) -> bool:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False
    loop.call_later(delay_s, _deferred_trim)
    return True


def _deferred_trim() -> None:
    global _last, _deferred
    with _lock:
        _deferred = False
        _last = time.monotonic()
    _safe_trim()


def _safe_trim() -> bool:
    try:
        return trim()
    except Exception:  # never let housekeeping break the stream that triggered it
        log.debug("guard: malloc_trim failed", exc_info=True)
        return False
