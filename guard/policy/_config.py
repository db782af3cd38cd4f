"""The policy file (``guard.yaml``: ``runs``, ``tenants``, ``auth``, ``prices``, ``guard``,
``store`` and ``presets``) as one validated settings object.

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
from guard.policy._prices import DEFAULT_PRICE_BOOK, ModelPrice, PriceBook, parse_prices
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
class AuthConfig:
    """Bearer tokens, read from the named environment variables by the server (not here)."""

    admin_token_env: str | None = None
    tenants: dict[str, str] = field(default_factory=dict)  # tenant -> token env var name


@dataclass(frozen=True, slots=True)
class GuardSettings:
    agent_grace_s: float = 30.0
    max_tracked_runs: int = 100_000
    # Span requests queued for the applier, in bytes; past a tenant's share of it (this over
    # the tenants with spans queued) its requests are shed with a retry delay.
    max_queued_span_bytes: int = 8 * 1024 * 1024
    # Runs made from spans alone (no RunStarted), per tenant per second; None: no limit.
    # Past it such a span is refused (partial_success) instead of costing a run's state.
    max_new_span_runs_per_s: float | None = 1000.0
    heartbeat_interval_ms: int = 1000
    admit_timeout_ms: int = 200
    # Tenant allowances: a grant is exactly what a call asks for, and holds for
    # allowance_ttl_s unless renewed (the guard renews live runs' grants at half that).
    # allowance_fraction sized grants made ahead of need; they let idle runs sit on a
    # tenant's window, so grants no longer are: still accepted (validated, no effect) so that
    # existing policy files keep loading.
    allowance_fraction: float = 0.05
    allowance_ttl_s: float = 30.0
    # Several replicas (serve --redis): while Redis is unreachable a replica enforces its own
    # local windows (fail-open); fail_closed denies new runs instead (live runs go on). A
    # run's concurrency slot in Redis lapses slot_lease_s after its replica last renewed it
    # (renewed every third of that), so a dead replica's runs free their slots.
    fail_closed: bool = False
    slot_lease_s: float = 30.0
    # How long a call to Redis (connect included) may take before the replica takes Redis for
    # unreachable: short, so a dead Redis costs an admission little before the fallback.
    redis_timeout_ms: float = 100.0
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
                "poll_tools": list(v.poll_tools),
                "max_unchanged_polls": v.max_unchanged_polls,
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
    if "redis_timeout_ms" in d:
        kw["redis_timeout_ms"] = req_float(
            d["redis_timeout_ms"], f"{path}.redis_timeout_ms", minimum=1.0
        )
    if "max_new_span_runs_per_s" in d:
        kw["max_new_span_runs_per_s"] = opt_float(
            d["max_new_span_runs_per_s"], f"{path}.max_new_span_runs_per_s", minimum=1.0
        )
    if "max_queued_span_bytes" in d:
        v = opt_int(d["max_queued_span_bytes"], f"{path}.max_queued_span_bytes", minimum=65536)
        if v is None:
            raise ConfigError(
                "must be an int >= 65536, not null", path=f"{path}.max_queued_span_bytes"
            )
        kw["max_queued_span_bytes"] = v
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
            prices=parse_prices(d.get("prices"), "prices"),
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
