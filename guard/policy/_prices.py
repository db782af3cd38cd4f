"""The price book: USD per 1M tokens per model, and the cost of one call.

``PriceBook.rates(model)`` is the one place a model's rates are looked up (exact name, then
the longest known prefix) and ``cost_usd`` the one place a call is priced; the SDK, the guard
and the integrations' reservations all go through them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from guard.policy._parse import check_keys, opt_float, req_float, req_mapping, req_str

__all__ = ["DEFAULT_PRICE_BOOK", "ModelPrice", "PriceBook", "parse_prices"]


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """USD per 1M tokens. ``cached_input`` ``None`` = billed as ordinary input."""

    input: float
    output: float
    cached_input: float | None = None


@dataclass(frozen=True)
class PriceBook:
    """A versioned price book. Unknown models are unpriced (cost ``None``), never free."""

    version: str
    models: dict[str, ModelPrice] = field(default_factory=dict)
    # model -> rates (or None: unpriced), filled by rates(); the models are not changed later
    _rates: dict[str, tuple[float, float, float] | None] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def price(self, model: str) -> ModelPrice | None:
        """Exact name first, then the longest known prefix (``gpt-4.1-2025-04-14``)."""
        p = self.models.get(model)
        if p is not None:
            return p
        best = None
        for name in self.models:
            if model.startswith(name) and (best is None or len(name) > len(best)):
                best = name
        return None if best is None else self.models[best]

    def rates(self, model: str) -> tuple[float, float, float] | None:
        """``(input, cached input, output)`` USD per 1M tokens of ``model`` (found as
        :meth:`price` finds it), ``None`` when unpriced. Remembered per book (bounded): the
        per-call path prices a call with one dict lookup."""
        r: tuple[float, float, float] | None = self._rates.get(model, _UNSEEN)
        if r is _UNSEEN:
            p = self.price(model)
            r = None if p is None else (p.input, _or(p.cached_input, p.input), p.output)
            if len(self._rates) < _RATES_MAX:  # model names come from code, rarely from data
                self._rates[model] = r
        return r

    def cost_usd(
        self, model: str, *, input_tokens: int, output_tokens: int, cached_tokens: int = 0
    ) -> float | None:
        """Cost of one call; ``input_tokens`` includes ``cached_tokens`` (GenAI semconv)."""
        # hot (every model call): rates() inline
        r: tuple[float, float, float] | None = self._rates.get(model, _UNSEEN)
        if r is _UNSEEN:
            r = self.rates(model)
        if r is None:
            return None
        if (
            type(input_tokens) is int
            and type(cached_tokens) is int
            and type(output_tokens) is int
            and input_tokens >= 0
            and cached_tokens >= 0
            and output_tokens >= 0
        ):  # the usual case: the same numbers as below without the min/max calls
            cached = cached_tokens if cached_tokens < input_tokens else input_tokens
            fresh = input_tokens - cached
            out = output_tokens
        else:
            cached = min(max(cached_tokens, 0), max(input_tokens, 0))
            fresh = max(input_tokens, 0) - cached
            out = max(output_tokens, 0)
        return (fresh * r[0] + cached * r[1] + out * r[2]) / 1e6


_UNSEEN: Any = object()
_RATES_MAX = 4096


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


DEFAULT_PRICE_BOOK = PriceBook(
    version="builtin-2026-11",
    models={
        "gpt-4.1": ModelPrice(2.0, 8.0, 0.5),
        "gpt-4.1-mini": ModelPrice(0.4, 1.6, 0.1),
        "gpt-4.1-nano": ModelPrice(0.1, 0.4, 0.025),
        "gpt-4o": ModelPrice(2.5, 10.0, 1.25),
        "gpt-4o-mini": ModelPrice(0.15, 0.6, 0.075),
        "o4-mini": ModelPrice(1.1, 4.4, 0.275),
        "claude-sonnet-4": ModelPrice(3.0, 15.0, 0.3),
        "claude-haiku-4": ModelPrice(1.0, 5.0, 0.1),
        "claude-opus-4": ModelPrice(15.0, 75.0, 1.5),
        "gemini-2.5-pro": ModelPrice(1.25, 10.0, 0.31),
        "gemini-2.5-flash": ModelPrice(0.3, 2.5, 0.075),
    },
)


def parse_prices(data: Any, path: str) -> PriceBook:
    """The policy file's ``prices`` section (``None``: the built-in book)."""
    if data is None:
        return DEFAULT_PRICE_BOOK
    d = req_mapping(data, path)
    check_keys(d, {"version", "models"}, path, required={"version"})
    version = d["version"]
    if isinstance(version, int | float) and not isinstance(version, bool):
        version = str(version)
    version = req_str(version, f"{path}.version")
    models: dict[str, ModelPrice] = {}
    for name, m in req_mapping(d.get("models") or {}, f"{path}.models").items():
        p = f"{path}.models.{name}"
        mm = req_mapping(m, p)
        check_keys(mm, {"input", "output", "cached_input"}, p, required={"input", "output"})
        models[str(name)] = ModelPrice(
            input=req_float(mm["input"], f"{p}.input", minimum=0.0),
            output=req_float(mm["output"], f"{p}.output", minimum=0.0),
            cached_input=opt_float(mm.get("cached_input"), f"{p}.cached_input", minimum=0.0),
        )
    return PriceBook(version=version, models=models)
