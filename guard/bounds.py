"""Bounds on every value the guard accepts from the wire, which it treats as hostile input.

One place for the numbers, shared by the wire conversions (``guard.wire``), the span
decoders (``guard.server.decode._pydecode`` and the native one), the control stream and the admin
service. A value outside its bound refuses its request: :class:`~guard.errors.InvalidInput`
(INVALID_ARGUMENT) for a bad value, :class:`~guard.errors.InputTooLarge`
(RESOURCE_EXHAUSTED) for a size. The checks return the value so call sites stay one line.

Why these numbers: an id or a name longer than 256 characters is not one an SDK generates;
1e12 tokens, steps or calls in one value is an attack or a bug, not usage (and keeps every
sum exact in a float); $1e6 for one model call, or $1e9 for one whole run, is beyond any
real price, while it keeps any sum of them far from float overflow (the rolling windows
would otherwise reach ``inf``); timestamps before 2000-01-01 or more than a day ahead of
the guard's clock are a broken clock or an attack (ClickHouse's DateTime64 refuses far
values and would block the store).
"""

from __future__ import annotations

import math
import time

from guard.errors import InputTooLarge, InvalidInput

__all__ = [
    "MAX_COST_USD_PER_RECORD",
    "MAX_COST_USD_PER_SPAN",
    "MAX_COUNTER",
    "MAX_FUTURE_S",
    "MAX_ID_CHARS",
    "MAX_LIMIT_S",
    "MAX_QUERY_UNIX_S",
    "MAX_RECORD_AGE_S",
    "MAX_RUNS_PER_MESSAGE",
    "MAX_TEXT_CHARS",
    "MIN_UNIX_S",
    "check_cost",
    "check_count",
    "check_finite",
    "check_id",
    "check_text",
    "check_unix",
]

MAX_ID_CHARS = 256  # run ids, tenants, agents, process ids, tool names, hashes, versions
MAX_TEXT_CHARS = 4096  # human text: outcome messages, cancel reasons, details
MAX_COUNTER = 10**12  # tokens, steps, calls, attempts, milliseconds: per value
MAX_COST_USD_PER_SPAN = 1e6  # one model call / one span's guard.cost.usd
MAX_COST_USD_PER_RECORD = 1e9  # a run's total (RunEnded usage, re-registered usage)
MAX_LIMIT_S = 1e9  # deadline_s / reserve_s (~31 years): anything above is "no deadline"
MIN_UNIX_S = 946_684_800.0  # 2000-01-01T00:00:00Z
MAX_FUTURE_S = 86_400.0  # a timestamp may be this far ahead of the guard's clock
# A termination record's timestamps this far behind the guard's clock are a broken agent
# clock, not a late record (the SDK holds records only while its process lives): the guard
# replaces them by its receive time (``guard.server.runs._record_in``).
MAX_RECORD_AGE_S = 30 * 86_400.0
MAX_QUERY_UNIX_S = 4_102_444_800.0  # 2100-01-01: Report since/until
MAX_RUNS_PER_MESSAGE = 10_000  # Hello.live_runs and Heartbeat.runs entries in one message


def check_id(name: str, value: str, *, required: bool = False) -> str:
    """An id or a name: at most :data:`MAX_ID_CHARS` characters (empty unless required)."""
    if len(value) > MAX_ID_CHARS:
        raise InputTooLarge(f"{name} has {len(value)} chars (max {MAX_ID_CHARS})")
    if required and not value:
        raise InvalidInput(f"{name} is empty")
    return value


def check_text(name: str, value: str) -> str:
    """Human text: at most :data:`MAX_TEXT_CHARS` characters."""
    if len(value) > MAX_TEXT_CHARS:
        raise InputTooLarge(f"{name} has {len(value)} chars (max {MAX_TEXT_CHARS})")
    return value


def check_count(name: str, value: int) -> int:
    """A counter: an int in ``[0, MAX_COUNTER]``."""
    value = int(value)
    if not 0 <= value <= MAX_COUNTER:
        raise InvalidInput(f"{name} {value} out of range [0, {MAX_COUNTER}]")
    return value


def check_finite(name: str, value: float, maximum: float) -> float:
    """A finite number in ``[0, maximum]``."""
    value = float(value)
    if not math.isfinite(value):
        raise InvalidInput(f"{name} must be finite (got {value!r})")
    if not 0.0 <= value <= maximum:
        raise InvalidInput(f"{name} {value!r} out of range [0, {maximum:g}]")
    return value


def check_cost(name: str, value: float, maximum: float = MAX_COST_USD_PER_RECORD) -> float:
    """A USD amount: finite, ``>= 0`` and at most ``maximum``."""
    return check_finite(name, value, maximum)


def check_unix(name: str, value: float, *, now: float | None = None) -> float:
    """A Unix timestamp in seconds: 0 (unset) or within 2000-01-01 .. now + 1 day."""
    value = float(value)
    if value == 0.0:
        return value
    if not math.isfinite(value):
        raise InvalidInput(f"{name} must be finite (got {value!r})")
    latest = (time.time() if now is None else now) + MAX_FUTURE_S
    if not MIN_UNIX_S <= value <= latest:
        raise InvalidInput(
            f"{name} {value!r} is outside [{MIN_UNIX_S:.0f} (2000-01-01), now + "
            f"{MAX_FUTURE_S:.0f}s]"
        )
    return value
