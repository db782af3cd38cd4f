"""Outcome / DecisionRecord -> one row (a list in table column order), sanitised.

Rows travel as one line of JSON text (``encode_row``): that line is the WAL record, the
spool payload and, joined, the ``JSONCompactEachRow`` body of the insert, so ClickHouse
parses it natively and the writer never re-encodes a row in Python. Timestamps are float
Unix seconds with millisecond precision (JSON numbers into DateTime64(3) are read as
seconds). Sanitising here matters: one negative counter would make ClickHouse
reject a whole batch, so counters are clamped to >= 0 and non-finite floats become NULL.
A timestamp past what ``DateTime64(3)`` holds (year 2299) is not clamped: it is not true
data, so ``run_row``/``decision_row`` raise ``ValueError`` and the store quarantines the
record in ``dead_letter`` (``dead_letter_row``) instead of inventing a time.

``run_line`` is what ``Store.write_run`` calls: ``encode_row(run_row(o))`` byte for byte
(the same JSON values, tested against it), with a fast path for the common record whose
every field already has its column's type and range, so none needs sanitising.
"""

from __future__ import annotations

import json
import math
import operator
import time
from typing import TYPE_CHECKING, Any

from guard.policy._types import DecidedBy, Outcome, Reason, Status
from guard.store._records import DecisionRecord
from guard.store._schema import RUN_COLUMNS

__all__ = [
    "dead_letter_row",
    "decision_row",
    "encode_row",
    "native_available",
    "run_line",
    "run_row",
    "use_native",
]

encode_row = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode

_UINT32 = 2**32 - 1
_UINT64 = 2**64 - 1
_MAX_TS = 10_413_791_999.999  # 2299-12-31 23:59:59.999 UTC, the top of DateTime64(3)
_MAX_RAW = 1 << 20  # chars of a quarantined record's text kept in dead_letter


def _u(value: Any, top: int = _UINT32) -> int:
    if type(value) is int and 0 <= value <= top:  # the common case, kept cheap (hot path)
        return value
    try:
        n = int(value)
    except (TypeError, ValueError, OverflowError):
        return 0
    return 0 if n < 0 else min(n, top)


def _f(value: Any) -> float | None:
    if type(value) is float and math.isfinite(value):
        return value
    if value is None or isinstance(value, bool):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _ts(unix_s: Any) -> float:
    x = _f(unix_s)
    if x is not None and x > _MAX_TS:
        raise ValueError(f"timestamp {x!r} is past year 2299 (max {_MAX_TS})")
    return 0.0 if x is None or x < 0 else round(x, 3)


def _s(value: Any) -> str:
    if type(value) is str:
        return value
    if value is None:
        return ""
    return str(getattr(value, "value", value))


def _ns(value: Any) -> str | None:
    return None if value is None or value == "" else _s(value)


def run_row(o: Outcome, now: float | None = None) -> list[Any]:
    """One ``runs`` row in ``RUN_COLUMNS`` order.

    A missing ``ended_at`` (0) becomes the write time and a missing ``started_at`` is
    derived from ``elapsed_ms``: a 1970 timestamp would fall outside the retention TTL and
    ClickHouse would drop the row on insert.
    """
    ended = _ts(o.ended_at) or round(time.time() if now is None else now, 3)
    started = _ts(o.started_at) or round(max(0.0, ended - _u(o.elapsed_ms, _UINT64) / 1000), 3)
    return [
        _s(o.run_id),
        _ns(o.parent_run_id),
        _s(o.tenant),
        _s(o.agent),
        _s(o.status),
        _s(o.reason),
        _s(o.message),
        started,
        ended,
        _u(o.elapsed_ms, _UINT64),
        None if o.deadline_ms is None else _u(o.deadline_ms, _UINT64),
        _u(o.steps),
        _u(o.model_calls),
        _u(o.tool_calls),
        _u(o.tool_attempts),
        _u(o.input_tokens, _UINT64),
        _u(o.output_tokens, _UINT64),
        _u(o.reasoning_tokens, _UINT64),
        _u(o.cached_tokens, _UINT64),
        _f(o.cost_usd),
        _ns(o.last_tool),
        _ns(o.last_action_hash),
        _u(o.loop_hits),
        bool(o.partial_result),
        bool(o.recoverable),
        _s(o.price_book_version),
        _s(o.decided_by),
        _s(o.trace_id),
    ]


_RUN_FIELDS = operator.attrgetter(*RUN_COLUMNS)  # the Outcome fields, in column order
_ENUMS = (str, Status, Reason, DecidedBy)  # str types whose JSON text is their value
_q = json.encoder.encode_basestring_ascii  # str -> its JSON text (C), as encode_row does


def run_line(o: Outcome, now: float | None = None) -> tuple[str, str]:
    """``(encode_row(run_row(o, now)), run id)``: the WAL line of one ``runs`` row.

    Fast path when nothing needs sanitising (exact types, counters in range, real
    timestamps): the line is formatted directly (natively when ``_rowsnative`` is built and
    on, else ``_py_line``). Any other record takes the reference path. Raises as
    ``run_row`` does.
    """
    fields = _RUN_FIELDS(o)
    line = _line(fields)
    if line is None:
        row = run_row(o, now)
        return encode_row(row), row[0]
    return line, fields[0]


def _py_line(fields: tuple[Any, ...]) -> str | None:
    """The fast path's line of ``_RUN_FIELDS(o)``, or ``None`` when a field needs sanitising.

    Timestamps as ``:.3f`` (the same number as ``round(x, 3)``, a fifth of the cost). This is
    the reference ``_rowsnative.line`` is tested byte-identical to.
    """
    (run_id, parent, tenant, agent, status, reason, message, started, ended, elapsed,
     deadline, steps, model_calls, tool_calls, tool_attempts, input_tokens, output_tokens,
     reasoning_tokens, cached_tokens, cost, last_tool, action_hash, loop_hits, partial,
     recoverable, price_book, decided_by, trace_id) = fields  # fmt: skip
    if not (
        type(run_id) is type(tenant) is type(agent) is type(message) is str
        and type(price_book) is type(trace_id) is str
        and type(status) in _ENUMS
        and type(reason) in _ENUMS
        and type(decided_by) in _ENUMS
        and (parent is None or type(parent) is str)
        and (last_tool is None or type(last_tool) is str)
        and (action_hash is None or type(action_hash) is str)
        and type(steps) is type(model_calls) is type(tool_calls) is type(tool_attempts) is int
        and type(loop_hits) is type(elapsed) is type(input_tokens) is type(output_tokens) is int
        and type(reasoning_tokens) is type(cached_tokens) is int
        and (deadline is None or (type(deadline) is int and 0 <= deadline <= _UINT64))
        and type(partial) is type(recoverable) is bool
        and (cost is None or (type(cost) is float and math.isfinite(cost)))
        and type(started) is type(ended) is float
        and 1.0 <= started <= _MAX_TS
        and 1.0 <= ended <= _MAX_TS
        and min(steps, model_calls, tool_calls, tool_attempts, loop_hits) >= 0
        and max(steps, model_calls, tool_calls, tool_attempts, loop_hits) <= _UINT32
        and min(elapsed, input_tokens, output_tokens, reasoning_tokens, cached_tokens) >= 0
        and max(elapsed, input_tokens, output_tokens, reasoning_tokens, cached_tokens) <= _UINT64
    ):
        return None
    return (
        f"[{_q(run_id)},{'null' if not parent else _q(parent)},{_q(tenant)},{_q(agent)},"
        f"{_q(status)},{_q(reason)},{_q(message)},{started:.3f},{ended:.3f},"
        f"{elapsed},{'null' if deadline is None else deadline},{steps},{model_calls},"
        f"{tool_calls},{tool_attempts},{input_tokens},{output_tokens},{reasoning_tokens},"
        f"{cached_tokens},{'null' if cost is None else float.__repr__(cost)},"
        f"{'null' if not last_tool else _q(last_tool)},"
        f"{'null' if not action_hash else _q(action_hash)},{loop_hits},"
        f"{'true' if partial else 'false'},{'true' if recoverable else 'false'},"
        f"{_q(price_book)},{_q(decided_by)},{_q(trace_id)}]"
    )


if TYPE_CHECKING:  # pragma: no cover
    from typing import Protocol

    class _Native(Protocol):  # the module _rowsnative.pyi describes
        def line(self, fields: tuple[Any, ...], /) -> str | None: ...
        def configure(self, *name_types: type) -> None: ...


_NATIVE: _Native | None
try:
    from guard.store import _rowsnative as _NATIVE
except ImportError:  # pragma: no cover - installed without a C compiler
    _NATIVE = None
else:
    assert _NATIVE is not None  # (imported)
    _NATIVE.configure(Status, Reason, DecidedBy)

_line = _py_line if _NATIVE is None else _NATIVE.line


def native_available() -> bool:
    """Whether fast-path lines are formatted natively (built, and not turned off)."""
    return _line is not _py_line


def use_native(on: bool) -> bool:
    """Format fast-path lines natively (when built) or with ``_py_line``; returns the previous
    setting. For benchmarks, the differential tests and ``OTEL_GUARD_PURE_PYTHON=1``."""
    global _line
    before = _line is not _py_line
    _line = _NATIVE.line if on and _NATIVE is not None else _py_line
    return before


def decision_row(r: DecisionRecord) -> list[Any]:
    """One ``decisions`` row in ``DECISION_COLUMNS`` order."""
    return [
        _ts(r.decided_at) or round(time.time(), 3),
        _s(r.run_id),
        _s(r.tenant),
        _s(r.agent),
        _s(r.action),
        _s(r.reason),
        _s(r.detail),
        _f(r.utilisation),
        _ns(r.metric),
        _u(r.command_id, _UINT64),
        _s(r.decided_by),
        _f(r.delivery_latency_ms),
        _s(r.guard_id),
    ]


def dead_letter_row(table: str, token: str, error: str, raw: str, now: float | None = None) -> str:
    """One encoded ``dead_letter`` row (``DEAD_LETTER_COLUMNS``): the raw record text, bounded."""
    if len(raw) > _MAX_RAW:
        raw = raw[:_MAX_RAW] + f"... ({len(raw)} chars)"
    return encode_row(
        [round(time.time() if now is None else now, 3), table, token, _one_line(error), raw]
    )


def _one_line(text: str, limit: int = 2000) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."
