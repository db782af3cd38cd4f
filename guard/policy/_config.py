"""The policy file (DESIGN §3.3b) as one validated settings object.

``PolicyConfig.from_dict`` takes the already-parsed YAML (the policy package never reads files
or imports yaml). Every key is checked: unknown keys, wrong types and out-of-range values raise
:class:`guard.errors.ConfigError` whose ``path`` names the key, e.g.
``tenants.acme.rolling[0].metrc``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from guard.errors import ConfigError
from guard.policy._parse import (
    check_keys,
    opt_float,
    opt_int,
    parse_limits,
    req_float,
    req_mapping,
    req_str,
)
from guard.policy._presets import PRESETS
from guard.policy._rolling import ROLLING_METRICS, RollingLimit, TenantLimits
from guard.policy._telemetry import MetricsSettings, parse_metrics
from guard.policy._types import Limits

__all__ = [
    "DEFAULT_PRICE_BOOK",
    "PRESETS",
    "AuthConfig",
    "GuardSettings",
    "ModelPrice",
    "PolicyConfig",
    "PriceBook",
    "StoreSettings",
    "limits_to_dict",
]


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
        r = self._rates.get(model, _UNSEEN)
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
        r = self._rates.get(model, _UNSEEN)  # hot (every model call): rates() inline
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


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """Bearer tokens, read from the named environment variables by the server (not here)."""

    admin_token_env: str | None = None
    tenants: dict[str, str] = field(default_factory=dict)  # tenant -> token env var name


@dataclass(frozen=True, slots=True)
class GuardSettings:
    agent_grace_s: float = 30.0
    max_tracked_runs: int = 100_000
    heartbeat_interval_ms: int = 1000
    admit_timeout_ms: int = 200
    # Tenant allowances (DESIGN §3.5): each grant to a run is at most this fraction of the
    # tightest cost_usd / tokens window (and an equal share of what is left), and holds for
    # allowance_ttl_s unless renewed (the guard renews live runs' grants at half that).
    allowance_fraction: float = 0.05
    allowance_ttl_s: float = 30.0
    # Several replicas (serve --redis): while Redis is unreachable a replica enforces its own
    # local windows (fail-open); fail_closed denies new runs instead (live runs go on). A
    # run's concurrency slot in Redis lapses slot_lease_s after its replica last renewed it
    # (renewed every third of that), so a dead replica's runs free their slots.
    fail_closed: bool = False
    slot_lease_s: float = 30.0
    # The guard's own metrics (Prometheus endpoint, OTLP export): off unless configured.
    metrics: MetricsSettings = field(default_factory=MetricsSettings)


@dataclass(frozen=True, slots=True)
class StoreSettings:
    retention_days: int | None = 90


def limits_to_dict(limits: Limits) -> dict[str, Any]:
    """Plain dict of the fields that differ from the defaults (``loop`` as a nested dict)."""
    out: dict[str, Any] = {}
    default = Limits()
    for f in fields(Limits):
        v = getattr(limits, f.name)
        if v == getattr(default, f.name):
            continue
        if f.name == "loop":
            v = {
                "window": v.window,
                "repeat_threshold": v.repeat_threshold,
                "no_progress_steps": v.no_progress_steps,
                "ignore_fields": list(v.ignore_fields),
            }
        elif f.name == "soft_thresholds":
            v = list(v)
        out[f.name] = v
    return out


def _tenant(data: Any, path: str) -> TenantLimits:
    d = req_mapping(data, path)
    check_keys(d, {"max_concurrent_runs", "rolling"}, path)
    cap = opt_int(d.get("max_concurrent_runs"), f"{path}.max_concurrent_runs", minimum=1)
    rolling_raw = d.get("rolling", [])
    if rolling_raw is None:
        rolling_raw = []
    if not isinstance(rolling_raw, list | tuple):
        raise ConfigError(
            f"must be a list, got {type(rolling_raw).__name__}", path=f"{path}.rolling"
        )
    rolling = []
    for i, item in enumerate(rolling_raw):
        p = f"{path}.rolling[{i}]"
        r = req_mapping(item, p)
        check_keys(r, {"metric", "limit", "window_s"}, p, required={"metric", "limit", "window_s"})
        metric = req_str(r["metric"], f"{p}.metric")
        if metric not in ROLLING_METRICS:
            raise ConfigError(
                f"unknown metric {metric!r}; expected one of {', '.join(ROLLING_METRICS)}",
                path=f"{p}.metric",
            )
        limit = req_float(r["limit"], f"{p}.limit", minimum=0.0, exclusive=True)
        window = req_float(r["window_s"], f"{p}.window_s", minimum=0.0, exclusive=True)
        rolling.append(RollingLimit(metric, limit, window))
    return TenantLimits(max_concurrent_runs=cap, rolling=tuple(rolling))


def _auth(data: Any, path: str) -> AuthConfig | None:
    if data is None:
        return None
    d = req_mapping(data, path)
    check_keys(d, {"admin_token_env", "tenants"}, path)
    admin = d.get("admin_token_env")
    admin = None if admin is None else req_str(admin, f"{path}.admin_token_env")
    tenants: dict[str, str] = {}
    for name, t in req_mapping(d.get("tenants") or {}, f"{path}.tenants").items():
        p = f"{path}.tenants.{name}"
        if isinstance(t, str):
            tenants[str(name)] = req_str(t, p)
            continue
        tm = req_mapping(t, p)
        check_keys(tm, {"token_env"}, p, required={"token_env"})
        tenants[str(name)] = req_str(tm["token_env"], f"{p}.token_env")
    return AuthConfig(admin_token_env=admin, tenants=tenants)


def _prices(data: Any, path: str) -> PriceBook:
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


def _guard(data: Any, path: str) -> GuardSettings:
    if data is None:
        return GuardSettings()
    d = req_mapping(data, path)
    names = {f.name for f in fields(GuardSettings)}
    check_keys(d, names, path)
    kw: dict[str, Any] = {}
    if "agent_grace_s" in d:
        kw["agent_grace_s"] = req_float(d["agent_grace_s"], f"{path}.agent_grace_s", minimum=0.0)
    if "allowance_fraction" in d:
        f = req_float(
            d["allowance_fraction"], f"{path}.allowance_fraction", minimum=0.0, exclusive=True
        )
        if f > 1.0:
            raise ConfigError(f"must be <= 1, got {f:g}", path=f"{path}.allowance_fraction")
        kw["allowance_fraction"] = f
    if "allowance_ttl_s" in d:
        kw["allowance_ttl_s"] = req_float(
            d["allowance_ttl_s"], f"{path}.allowance_ttl_s", minimum=0.0, exclusive=True
        )
    if "metrics" in d:
        kw["metrics"] = parse_metrics(d["metrics"], f"{path}.metrics")
    if "fail_closed" in d:
        if not isinstance(d["fail_closed"], bool):
            got = type(d["fail_closed"]).__name__
            raise ConfigError(f"must be true or false, got {got}", path=f"{path}.fail_closed")
        kw["fail_closed"] = d["fail_closed"]
    if "slot_lease_s" in d:
        kw["slot_lease_s"] = req_float(d["slot_lease_s"], f"{path}.slot_lease_s", minimum=0.3)
    for name in ("max_tracked_runs", "heartbeat_interval_ms", "admit_timeout_ms"):
        if name in d:
            v = opt_int(d[name], f"{path}.{name}", minimum=1)
            if v is None:
                raise ConfigError("must be an int >= 1, not null", path=f"{path}.{name}")
            kw[name] = v
    return GuardSettings(**kw)


def _store(data: Any, path: str) -> StoreSettings:
    if data is None:
        return StoreSettings()
    d = req_mapping(data, path)
    check_keys(d, {"retention_days"}, path)
    if "retention_days" not in d:
        return StoreSettings()
    return StoreSettings(opt_int(d["retention_days"], f"{path}.retention_days", minimum=1))


@dataclass(frozen=True)
class PolicyConfig:
    """The whole policy file. Build with :meth:`from_dict`; all parts are immutable."""

    runs: Limits = field(default_factory=Limits)
    tenants: dict[str, TenantLimits] = field(default_factory=dict)
    auth: AuthConfig | None = None
    prices: PriceBook = DEFAULT_PRICE_BOOK
    guard: GuardSettings = field(default_factory=GuardSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    presets: dict[str, Limits] = field(default_factory=lambda: dict(PRESETS))
    default_tenant: TenantLimits = field(default_factory=TenantLimits)

    _SECTIONS = ("runs", "tenants", "auth", "prices", "guard", "store", "presets")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> PolicyConfig:
        """Validate a parsed policy file. ``None`` or ``{}`` gives the defaults."""
        if data is None:
            return cls()
        d = req_mapping(data, "")
        check_keys(d, set(cls._SECTIONS), "")
        runs = parse_limits(d.get("runs") or {}, "runs")
        tenants_raw = req_mapping(d.get("tenants") or {}, "tenants")
        tenants = {str(k): _tenant(v, f"tenants.{k}") for k, v in tenants_raw.items()}
        presets = dict(PRESETS)
        for name, v in req_mapping(d.get("presets") or {}, "presets").items():
            base = presets.get(str(name), Limits())
            presets[str(name)] = parse_limits(v, f"presets.{name}", base=base)
        return cls(
            runs=runs,
            tenants=tenants,
            auth=_auth(d.get("auth"), "auth"),
            prices=_prices(d.get("prices"), "prices"),
            guard=_guard(d.get("guard"), "guard"),
            store=_store(d.get("store"), "store"),
            presets=presets,
        )

    def to_dict(self) -> dict[str, Any]:
        """The inverse of :meth:`from_dict` (``from_dict(c.to_dict()) == c``)."""
        out: dict[str, Any] = {"runs": limits_to_dict(self.runs)}
        if self.tenants:
            out["tenants"] = {
                name: {
                    **(
                        {"max_concurrent_runs": t.max_concurrent_runs}
                        if t.max_concurrent_runs is not None
                        else {}
                    ),
                    "rolling": [
                        {"metric": r.metric, "limit": r.limit, "window_s": r.window_s}
                        for r in t.rolling
                    ],
                }
                for name, t in self.tenants.items()
            }
        if self.auth is not None:
            auth: dict[str, Any] = {
                "tenants": {k: {"token_env": v} for k, v in self.auth.tenants.items()}
            }
            if self.auth.admin_token_env is not None:
                auth["admin_token_env"] = self.auth.admin_token_env
            out["auth"] = auth
        out["prices"] = {
            "version": self.prices.version,
            "models": {
                name: {
                    "input": p.input,
                    "output": p.output,
                    **({"cached_input": p.cached_input} if p.cached_input is not None else {}),
                }
                for name, p in self.prices.models.items()
            },
        }
        out["guard"] = asdict(self.guard)  # nested settings (metrics) as mappings too
        out["store"] = {"retention_days": self.store.retention_days}
        changed = {k: v for k, v in self.presets.items() if PRESETS.get(k) != v}
        if changed:
            out["presets"] = {k: limits_to_dict(v) for k, v in changed.items()}
        return out

    def effective_limits(
        self, requested: Limits | None = None, *, preset: str | None = None
    ) -> Limits:
        """Run defaults, tightened by a preset, tightened by the decorator: tightest wins."""
        limits = self.runs
        if preset is not None:
            if preset not in self.presets:
                raise ConfigError(
                    f"unknown preset {preset!r}; known: {', '.join(sorted(self.presets))}",
                    path="preset",
                )
            limits = limits.tighten(self.presets[preset])
        return limits.tighten(requested)

    def tenant_limits(self, tenant: str) -> TenantLimits:
        """The tenant's limits; tenants not in the file are unlimited."""
        return self.tenants.get(tenant, self.default_tenant)

    def with_runs(self, runs: Limits) -> PolicyConfig:
        return replace(self, runs=runs)
