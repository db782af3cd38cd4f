"""Small validators for the policy file: every failure is a ConfigError with the key's path."""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import replace
from typing import Any

from guard.errors import ConfigError
from guard.policy._types import Limits, LoopSettings

__all__ = [
    "MAX_LOOP_WINDOW",
    "check_keys",
    "opt_float",
    "opt_int",
    "parse_limits",
    "parse_loop",
    "req_float",
    "req_mapping",
    "req_str",
]

# The loop window is per live run; capping it keeps the guard's memory per run bounded.
MAX_LOOP_WINDOW = 256
# max_unchanged_polls: a bound of a million identical answers is no bound worth having.
MAX_UNCHANGED_POLLS = 1_000_000
_LOOP_KEYS = {
    "window",
    "repeat_threshold",
    "no_progress_steps",
    "ignore_fields",
    "poll_tools",
    "max_unchanged_polls",
}


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _type(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def req_mapping(v: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise ConfigError(f"must be a mapping, got {_type(v)}", path=path or None)
    return v


def check_keys(
    d: Mapping[str, Any],
    allowed: AbstractSet[str],
    path: str,
    *,
    required: AbstractSet[str] = frozenset(),
) -> None:
    """Unknown keys are errors (sorted, so the first reported is deterministic)."""
    for k in sorted(d, key=str):
        if not isinstance(k, str):
            raise ConfigError(f"keys must be strings, got {_type(k)}", path=_join(path, str(k)))
        if k not in allowed:
            raise ConfigError(
                f"unknown key {k!r}; expected one of {', '.join(sorted(allowed))}",
                path=_join(path, k),
            )
    for k in sorted(required):
        if k not in d:
            raise ConfigError("required key is missing", path=_join(path, k))


def req_str(v: Any, path: str) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ConfigError(f"must be a non-empty string, got {_type(v)} {v!r}", path=path)
    return v


def opt_int(v: Any, path: str, *, minimum: int = 0, maximum: int | None = None) -> int | None:
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"must be an integer, got {_type(v)} {v!r}", path=path)
    if v < minimum:
        hint = " (use null to disable)" if v == 0 and minimum > 0 else ""
        raise ConfigError(f"must be >= {minimum}, got {v}{hint}", path=path)
    if maximum is not None and v > maximum:
        raise ConfigError(f"must be <= {maximum}, got {v}", path=path)
    return v


def req_float(v: Any, path: str, *, minimum: float | None = None, exclusive: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ConfigError(f"must be a number, got {_type(v)} {v!r}", path=path)
    x = float(v)
    if not math.isfinite(x):
        raise ConfigError(f"must be finite, got {x}", path=path)
    if minimum is not None and (x <= minimum if exclusive else x < minimum):
        op = ">" if exclusive else ">="
        hint = " (use null to disable)" if x == 0 and exclusive else ""
        raise ConfigError(f"must be {op} {minimum:g}, got {x:g}{hint}", path=path)
    return x


def opt_float(
    v: Any, path: str, *, minimum: float | None = None, exclusive: bool = False
) -> float | None:
    return None if v is None else req_float(v, path, minimum=minimum, exclusive=exclusive)


def parse_loop(v: Any, path: str, base: LoopSettings) -> LoopSettings:
    d = req_mapping(v, path)
    check_keys(d, _LOOP_KEYS, path)
    kw: dict[str, Any] = {}
    for name, lo in (("window", 2), ("repeat_threshold", 2), ("no_progress_steps", 2)):
        if name in d:
            got = opt_int(d[name], f"{path}.{name}", minimum=lo, maximum=MAX_LOOP_WINDOW)
            if got is None:
                raise ConfigError(f"must be an integer >= {lo}, got null", path=f"{path}.{name}")
            kw[name] = got
    for name in ("ignore_fields", "poll_tools"):
        if name in d:
            raw = d[name]
            if not isinstance(raw, list | tuple):
                raise ConfigError(
                    f"must be a list of strings, got {_type(raw)}", path=f"{path}.{name}"
                )
            kw[name] = tuple(req_str(x, f"{path}.{name}[{i}]") for i, x in enumerate(raw))
    if "max_unchanged_polls" in d:  # null turns the poll rule off
        kw["max_unchanged_polls"] = opt_int(
            d["max_unchanged_polls"],
            f"{path}.max_unchanged_polls",
            minimum=2,
            maximum=MAX_UNCHANGED_POLLS,
        )
    out = replace(base, **kw)
    if out.repeat_threshold > out.window:
        raise ConfigError(
            f"repeat_threshold {out.repeat_threshold} exceeds window {out.window}",
            path=f"{path}.repeat_threshold",
        )
    return out


_INT_LIMITS = ("max_steps", "max_tool_calls", "max_model_calls", "max_tokens", "reserve_tokens")
_FLOAT_LIMITS = ("max_cost_usd", "deadline_s", "reserve_s")


def parse_limits(v: Any, path: str, *, base: Limits | None = None) -> Limits:
    """A ``runs``/preset section: the fields of :class:`Limits`, validated."""
    d = req_mapping(v, path)
    base = base if base is not None else Limits()
    allowed = set(_INT_LIMITS) | set(_FLOAT_LIMITS)
    allowed |= {"soft_thresholds", "loop", "pause_freezes_deadline", "timeout_margin_s"}
    allowed.add("implicit_estimates")
    check_keys(d, allowed, path)
    kw: dict[str, Any] = {}
    for name in _INT_LIMITS:
        if name in d:
            kw[name] = opt_int(d[name], f"{path}.{name}", minimum=1)
    for name in _FLOAT_LIMITS:
        if name in d:
            kw[name] = opt_float(d[name], f"{path}.{name}", minimum=0.0, exclusive=True)
    if "soft_thresholds" in d:
        raw = d["soft_thresholds"]
        p = f"{path}.soft_thresholds"
        if not isinstance(raw, list | tuple) or len(raw) > 2:
            raise ConfigError(f"must be a list of up to 2 fractions, got {raw!r}", path=p)
        vals = tuple(
            req_float(x, f"{p}[{i}]", minimum=0.0, exclusive=True) for i, x in enumerate(raw)
        )
        for i, x in enumerate(vals):
            if x > 1.0:
                raise ConfigError(f"must be a fraction in (0, 1], got {x:g}", path=f"{p}[{i}]")
        if len(vals) == 2 and vals[0] > vals[1]:
            raise ConfigError(f"warn {vals[0]:g} must not exceed wrap_up {vals[1]:g}", path=p)
        kw["soft_thresholds"] = vals
    if "loop" in d:
        kw["loop"] = parse_loop(d["loop"], f"{path}.loop", base.loop)
    for name in ("pause_freezes_deadline", "implicit_estimates"):
        if name in d:
            b = d[name]
            if not isinstance(b, bool):
                raise ConfigError(f"must be true or false, got {_type(b)}", path=f"{path}.{name}")
            kw[name] = b
    if "timeout_margin_s" in d:
        kw["timeout_margin_s"] = req_float(
            d["timeout_margin_s"], f"{path}.timeout_margin_s", minimum=0.0
        )
    out = replace(base, **kw)
    if (
        out.reserve_tokens is not None
        and out.max_tokens is not None
        and out.reserve_tokens >= out.max_tokens
    ):
        raise ConfigError(
            f"reserve_tokens {out.reserve_tokens} must be below max_tokens {out.max_tokens}",
            path=_join(path, "reserve_tokens"),
        )
    if out.reserve_s is not None and out.deadline_s is not None and out.reserve_s >= out.deadline_s:
        raise ConfigError(
            f"reserve_s {out.reserve_s:g} must be below deadline_s {out.deadline_s:g}",
            path=_join(path, "reserve_s"),
        )
    return out
