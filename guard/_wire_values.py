"""The policy value types on the wire: ``guard.v1`` <-> :class:`Limits`, :class:`Usage`, the
price book and the policy.

Part of :mod:`guard.wire` (which re-exports every public name here; the conventions are in its
docstring), and the one the other parts build on: ``_wire_checks`` and ``_wire_outcome`` check
and convert the usage and limits a message carries with these functions. It imports only
``guard.v1``, ``guard.bounds``, ``guard.errors`` and the policy's value types, never
:mod:`guard.wire` itself.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from typing import TYPE_CHECKING, Any

from guard.bounds import (
    MAX_COST_USD_PER_RECORD,
    MAX_COUNTER,
    MAX_LIMIT_S,
    check_count,
    check_finite,
)
from guard.errors import InputTooLarge, InvalidInput
from guard.policy._types import (
    DEFAULT_SOFT_THRESHOLDS,
    USAGE_COUNTERS,
    Limits,
    LoopSettings,
    Usage,
)
from guard.v1 import guard_pb2 as pb

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

    from guard.policy import PolicyConfig, PriceBook

__all__ = [
    "limits_from_pb",
    "limits_to_pb",
    "policy_from_pb",
    "policy_to_pb",
    "price_book_from_pb",
    "price_book_to_pb",
    "usage_from_pb",
    "usage_to_pb",
]

_INT_LIMITS = ("max_steps", "max_tool_calls", "max_model_calls", "max_tokens", "reserve_tokens")
_FLOAT_LIMITS = ("max_cost_usd", "deadline_s", "reserve_s")
_FLOAT_MAX = {"max_cost_usd": MAX_COST_USD_PER_RECORD, "deadline_s": MAX_LIMIT_S}
_MAX_THRESHOLDS = 16  # soft_thresholds entries (the default has three)
_MAX_LOOP_SETTING = 1_000_000  # loop window / repeat threshold / no-progress steps
_MAX_POLL_TOOLS = 256  # loop.poll_tools entries
_MAX_TOOL_NAME_CHARS = 256  # one poll tool's name


def _finite(name: str, value: float) -> float:
    if not math.isfinite(value):
        raise InvalidInput(f"{name} must be finite (got {value!r})")
    return float(value)


# --------------------------------------------------------------------------------- limits


def limits_to_pb(limits: Limits | None) -> pb.Limits:
    """Policy :class:`Limits` -> ``guard.v1.Limits`` (``None`` fields stay unset)."""
    msg = pb.Limits()
    if limits is None:
        return msg
    for name in _INT_LIMITS:
        value = getattr(limits, name)
        if value is not None:
            setattr(msg, name, int(value))
    for name in _FLOAT_LIMITS:
        value = getattr(limits, name)
        if value is not None:
            setattr(msg, name, float(value))
    msg.soft_thresholds.extend(float(x) for x in limits.soft_thresholds)
    loop = limits.loop
    msg.loop.window = loop.window
    msg.loop.repeat_threshold = loop.repeat_threshold
    msg.loop.no_progress_steps = loop.no_progress_steps
    msg.loop.poll_tools.extend(loop.poll_tools)
    if loop.max_unchanged_polls is not None:
        msg.loop.max_unchanged_polls = loop.max_unchanged_polls
    msg.pause_freezes_deadline = bool(limits.pause_freezes_deadline)
    msg.implicit_estimates = bool(limits.implicit_estimates)
    return msg


def limits_from_pb(msg: pb.Limits | None) -> Limits:
    """``guard.v1.Limits`` -> policy :class:`Limits`. Unset fields are ``None`` (no limit).

    Fields the wire does not carry (``timeout_margin_s``, ``loop.ignore_fields``) keep their
    defaults; an absent ``soft_thresholds`` list means the default thresholds.
    """
    if msg is None:
        return Limits()
    kw: dict[str, Any] = {}
    for name in _INT_LIMITS:
        if msg.HasField(name):
            value = int(getattr(msg, name))
            if value < 0:
                raise InvalidInput(f"limits.{name} must be >= 0 (got {value})")
            kw[name] = check_count(f"limits.{name}", value)
    for name in _FLOAT_LIMITS:
        if msg.HasField(name):
            number = _finite(f"limits.{name}", getattr(msg, name))
            if number < 0:
                raise InvalidInput(f"limits.{name} must be >= 0 (got {number})")
            kw[name] = check_finite(f"limits.{name}", number, _FLOAT_MAX.get(name, MAX_LIMIT_S))
    if len(msg.soft_thresholds) > _MAX_THRESHOLDS:
        raise InputTooLarge(
            f"limits.soft_thresholds has {len(msg.soft_thresholds)} entries (max {_MAX_THRESHOLDS})"
        )
    thresholds = tuple(check_finite("limits.soft_thresholds", x, 1.0) for x in msg.soft_thresholds)
    kw["soft_thresholds"] = thresholds or DEFAULT_SOFT_THRESHOLDS
    if msg.HasField("loop"):
        for name in ("window", "repeat_threshold", "no_progress_steps"):
            if getattr(msg.loop, name) > _MAX_LOOP_SETTING:
                raise InvalidInput(
                    f"limits.loop.{name} {getattr(msg.loop, name)} exceeds {_MAX_LOOP_SETTING}"
                )
        default = LoopSettings()
        # A zero in a uint32 loop field means "not sent": keep the default rather than a
        # detector that fires on every call.
        kw["loop"] = LoopSettings(
            window=msg.loop.window or default.window,
            repeat_threshold=msg.loop.repeat_threshold or default.repeat_threshold,
            no_progress_steps=msg.loop.no_progress_steps or default.no_progress_steps,
            poll_tools=_poll_tools(msg.loop.poll_tools),
            max_unchanged_polls=_max_unchanged_polls(msg.loop),
        )
    if msg.HasField("pause_freezes_deadline"):
        kw["pause_freezes_deadline"] = bool(msg.pause_freezes_deadline)
    if msg.HasField("implicit_estimates"):  # unset (an older peer): the default, on
        kw["implicit_estimates"] = bool(msg.implicit_estimates)
    return Limits(**kw)


def _poll_tools(names: Any) -> tuple[str, ...]:
    if len(names) > _MAX_POLL_TOOLS:
        raise InputTooLarge(
            f"limits.loop.poll_tools has {len(names)} entries (max {_MAX_POLL_TOOLS})"
        )
    for name in names:
        if not name or len(name) > _MAX_TOOL_NAME_CHARS:
            raise InvalidInput(
                f"limits.loop.poll_tools: a tool name must have 1..{_MAX_TOOL_NAME_CHARS} "
                f"characters (got {len(name)})"
            )
    return tuple(names)


def _max_unchanged_polls(loop: pb.LoopPolicy) -> int | None:
    """Unset (or 0, as for the other loop fields): ``None``, the rule off on the sender's side
    (the tightest side wins, so the other side's bound applies)."""
    if not loop.HasField("max_unchanged_polls") or not loop.max_unchanged_polls:
        return None
    value = int(loop.max_unchanged_polls)
    if value < 2 or value > _MAX_LOOP_SETTING:
        raise InvalidInput(
            f"limits.loop.max_unchanged_polls must be in 2..{_MAX_LOOP_SETTING} (got {value})"
        )
    return value


# ---------------------------------------------------------------------------------- usage


def usage_to_pb(usage: Usage | None) -> pb.Usage:
    """Policy :class:`Usage` -> ``guard.v1.Usage`` (``cost_usd`` unset while unpriced)."""
    msg = pb.Usage()
    if usage is None:
        return msg
    for name in USAGE_COUNTERS:
        setattr(msg, name, max(0, int(getattr(usage, name))))
    if usage.cost_usd is not None and math.isfinite(usage.cost_usd):
        msg.cost_usd = float(usage.cost_usd)
    return msg


# The eight counters of USAGE_COUNTERS, in its order.
_usage_counters: Callable[[pb.Usage], tuple[int, int, int, int, int, int, int, int]] = (
    operator.attrgetter(*USAGE_COUNTERS)
)
# Usage(*counters) below relies on this order (one RunEnded / allowance request each)
assert tuple(f.name for f in dataclasses.fields(Usage))[: len(USAGE_COUNTERS)] == USAGE_COUNTERS


def usage_from_pb(msg: pb.Usage | None) -> Usage:
    """``guard.v1.Usage`` -> policy :class:`Usage`. Rejects NaN, infinite or negative cost,
    counters above :data:`~guard.bounds.MAX_COUNTER` and a cost above
    :data:`~guard.bounds.MAX_COST_USD_PER_RECORD`."""
    if msg is None:
        return Usage()
    counters = _usage_counters(msg)  # uint64 fields: ints >= 0
    if max(counters) > MAX_COUNTER:
        for name, value in zip(USAGE_COUNTERS, counters, strict=True):
            check_count(f"usage.{name}", value)
    usage = Usage(*counters)
    if msg.HasField("cost_usd"):
        cost = _finite("usage.cost_usd", msg.cost_usd)
        if cost < 0:
            raise InvalidInput(f"usage.cost_usd must be >= 0 (got {cost})")
        usage.cost_usd = check_finite("usage.cost_usd", cost, MAX_COST_USD_PER_RECORD)
    return usage


# ------------------------------------------------------------------------ price book, policy


def price_book_to_pb(book: PriceBook) -> pb.PriceBook:
    """Policy ``PriceBook`` -> ``guard.v1.PriceBook`` (USD per 1M tokens)."""
    msg = pb.PriceBook(version=book.version or "")
    for model, price in book.models.items():
        entry = msg.models[model]
        entry.input = float(price.input)
        entry.output = float(price.output)
        cached = getattr(price, "cached_input", None)
        if cached is not None:
            entry.cached_input = float(cached)
    return msg


def price_book_from_pb(msg: pb.PriceBook | None) -> PriceBook:
    """``guard.v1.PriceBook`` -> policy ``PriceBook``. Rejects negative or non-finite prices."""
    from guard.policy import ModelPrice, PriceBook

    if msg is None:
        msg = pb.PriceBook()
    models = {}
    for model, entry in msg.models.items():
        inp = _finite(f"prices.models.{model}.input", entry.input)
        out = _finite(f"prices.models.{model}.output", entry.output)
        cached = (
            _finite(f"prices.models.{model}.cached_input", entry.cached_input)
            if entry.HasField("cached_input")
            else None
        )
        if inp < 0 or out < 0 or (cached is not None and cached < 0):
            raise InvalidInput(f"prices.models.{model}: prices must be >= 0")
        models[model] = ModelPrice(input=inp, output=out, cached_input=cached)
    return PriceBook(version=msg.version, models=models)


def policy_to_pb(config: PolicyConfig, *, version: str | None = None) -> pb.Policy:
    """Policy file -> ``guard.v1.Policy`` (run defaults and price book).

    ``version`` defaults to the price book version; the server may pass a config digest.
    """
    return pb.Policy(
        version=version if version is not None else (config.prices.version or ""),
        run_defaults=limits_to_pb(config.runs),
        prices=price_book_to_pb(config.prices),
    )


def policy_from_pb(msg: pb.Policy) -> tuple[str, Limits, PriceBook]:
    """``guard.v1.Policy`` -> ``(version, run_defaults, price_book)`` for the SDK."""
    defaults = limits_from_pb(msg.run_defaults) if msg.HasField("run_defaults") else Limits()
    return msg.version, defaults, price_book_from_pb(msg.prices)
