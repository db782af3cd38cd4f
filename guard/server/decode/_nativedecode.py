"""The native span decoder (``_otlpnative.c``), configured from the one schema.

:func:`decode` answers for the canonical, well-formed request and returns ``None`` for
anything else, which the caller then decodes with the reference (``_pydecode``); see the C
file's header for why that keeps the two exactly equal. ``available()`` is False when no C
compiler built the extension, or after ``set_enabled(False)`` (``otel-guard serve`` calls it
when ``OTEL_GUARD_PURE_PYTHON=1``).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from guard import semconv as sc
from guard.server.decode import _schema as s

__all__ = ["available", "decode", "set_enabled"]

_NATIVE: ModuleType | None
try:
    from guard.server.decode import _otlpnative as _NATIVE
except ImportError:  # pragma: no cover - installed without a C compiler
    _NATIVE = None

if _NATIVE is not None:
    _slots = {name: getattr(s, name) for name in (
        "RUN_ID", "OP", "MODEL", "RESP_MODEL", "IN", "OUT", "CACHED", "REASONING",
        "TOOL_NAME", "ERROR", "KIND", "FOREIGN", "TRACE_ID", "SPAN_ID", "PARENT_SPAN_ID",
        "NSLOTS", "KIND_RUN", "KIND_STEP", "KIND_MODEL", "KIND_TOOL",
    )}  # fmt: skip
    _NATIVE.configure(
        s.KEYS,
        _slots,
        s.Observation,
        sorted(s.MODEL_OPS),
        sorted(s.AGGREGATE_OPS),
        (s.MAX_COUNTER, s.MAX_ID_CHARS, s.MAX_COST),
        # per-call strings: never repeat, so not worth caching
        (s.ACTION_FP, s.RESULT_HASH, s.STATE_HASH, s.RESP_ID),
        (sc.STEP_SPAN, sc.INVOKE_AGENT, sc.EXECUTE_TOOL),
    )
    del _slots

_enabled = _NATIVE is not None


def available() -> bool:
    """Whether requests are decoded natively (built, and not turned off)."""
    return _enabled


def set_enabled(on: bool) -> bool:
    """Use the native decoder (when built) or the reference; returns the previous setting.
    For benchmarks and the differential tests."""
    global _enabled
    before = _enabled
    _enabled = bool(on) and _NATIVE is not None
    return before


def decode(data: bytes, state: Any, max_spans: int) -> tuple[list[s.Observation], int, Any] | None:
    """Decode up to ``max_spans`` spans from ``state`` (None: the start).

    Returns (observations, spans read, the state to go on from, or None at the end), or None
    when the request is one the native path does not answer for.
    """
    assert _NATIVE is not None  # the caller asked available() first
    return _NATIVE.decode(data, state, max_spans)
