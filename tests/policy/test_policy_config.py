"""The policy file: validation with key paths, tightest-wins merge, presets, prices."""

from __future__ import annotations

import copy

import pytest

from guard.errors import ConfigError
from guard.policy import (
    DEFAULT_PRICE_BOOK,
    PRESETS,
    AuthConfig,
    GuardSettings,
    Limits,
    LoopSettings,
    PolicyConfig,
    PriceBook,
    RollingLimit,
    StoreSettings,
    TenantLimits,
)

DESIGN_EXAMPLE = {
    "runs": {
        "max_steps": 50,
        "deadline_s": 300,
        "loop": {"window": 20, "repeat_threshold": 3, "no_progress_steps": 8},
        "soft_thresholds": [0.7, 0.9],
    },
    "tenants": {
        "acme": {
            "max_concurrent_runs": 20,
            "rolling": [
                {"metric": "cost_usd", "limit": 5.0, "window_s": 3600},
                {"metric": "tokens", "limit": 200000, "window_s": 60},
            ],
        }
    },
    "auth": {
        "admin_token_env": "OTEL_GUARD_ADMIN_TOKEN",
        "tenants": {"acme": {"token_env": "ACME_GUARD_TOKEN"}},
    },
    "prices": {
        "version": "2026-11",
        "models": {"gpt-4.1": {"input": 2.0, "output": 8.0, "cached_input": 0.5}},
    },
}


def test_design_example_parses() -> None:
    cfg = PolicyConfig.from_dict(DESIGN_EXAMPLE)
    assert cfg.runs.max_steps == 50 and cfg.runs.deadline_s == 300.0
    assert cfg.runs.loop == LoopSettings(window=20, repeat_threshold=3, no_progress_steps=8)
    assert cfg.runs.soft_thresholds == (0.7, 0.9)
    assert cfg.tenants["acme"] == TenantLimits(
        max_concurrent_runs=20,
        rolling=(RollingLimit("cost_usd", 5.0, 3600.0), RollingLimit("tokens", 200000.0, 60.0)),
    )
    assert cfg.auth == AuthConfig("OTEL_GUARD_ADMIN_TOKEN", {"acme": "ACME_GUARD_TOKEN"})
    assert cfg.prices.version == "2026-11"
    assert cfg.prices.cost_usd("gpt-4.1", input_tokens=1_000_000, output_tokens=0) == 2.0
    assert cfg.guard == GuardSettings() and cfg.store == StoreSettings()
    assert cfg.tenant_limits("unknown") == TenantLimits()


def test_defaults() -> None:
    for cfg in (PolicyConfig.from_dict(None), PolicyConfig.from_dict({}), PolicyConfig()):
        assert cfg.runs == Limits()
        assert cfg.auth is None and cfg.tenants == {}
        assert cfg.prices is DEFAULT_PRICE_BOOK
        assert cfg.guard.agent_grace_s == 30 and cfg.guard.max_tracked_runs == 100_000
        assert cfg.guard.heartbeat_interval_ms == 1000 and cfg.guard.admit_timeout_ms == 200
        assert cfg.store.retention_days == 90
        assert set(cfg.presets) == set(PRESETS)


def test_round_trip() -> None:
    data = copy.deepcopy(DESIGN_EXAMPLE)
    data["guard"] = {
        "agent_grace_s": 5,
        "max_tracked_runs": 10,
        "metrics": {"listen": "127.0.0.1:9464", "top_tenants": 3},
    }
    data["store"] = {"retention_days": None}
    data["presets"] = {"faq": {"max_steps": 2}, "triage": {"max_steps": 7}}
    cfg = PolicyConfig.from_dict(data)
    assert PolicyConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.store.retention_days is None


def _with(path: str, value) -> dict:
    """DESIGN_EXAMPLE with one key set (dotted path, [i] for list items)."""
    data = copy.deepcopy(DESIGN_EXAMPLE)
    node = data
    # "gpt-4.1" is one key: protect its dot from the split
    parts = [x.replace("~", ".") for x in path.replace("4.1", "4~1").replace("[", ".[").split(".")]
    for p in parts[:-1]:
        node = node[int(p[1:-1])] if p.startswith("[") else node.setdefault(p, {})
    last = parts[-1]
    if last.startswith("["):
        node[int(last[1:-1])] = value
    else:
        node[last] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "error_path", "needle"),
    [
        ("tenants.acme.rolling[0].metrc", "x", "tenants.acme.rolling[0].metrc", "unknown key"),
        ("runs.max_stpes", 3, "runs.max_stpes", "unknown key 'max_stpes'"),
        ("runs.loop.windw", 3, "runs.loop.windw", "unknown key"),
        ("bogus", {}, "bogus", "unknown key"),
        ("auth.tenants.acme.token", "X", "auth.tenants.acme.token", "unknown key"),
        ("prices.models.gpt-4.1.inptu", 1, "prices.models.gpt-4.1.inptu", "unknown key"),
        ("guard.grace", 1, "guard.grace", "unknown key"),
        ("store.retention", 1, "store.retention", "unknown key"),
        ("tenants.acme.burst", 1, "tenants.acme.burst", "unknown key"),
        ("runs.max_steps", "50", "runs.max_steps", "must be an integer"),
        ("runs.max_steps", 0, "runs.max_steps", "use null to disable"),
        ("runs.max_steps", -3, "runs.max_steps", "must be >= 1, got -3"),
        ("runs.max_steps", True, "runs.max_steps", "must be an integer"),
        ("runs.max_steps", 2.5, "runs.max_steps", "must be an integer"),
        ("runs.deadline_s", 0, "runs.deadline_s", "must be > 0"),
        ("runs.max_cost_usd", float("nan"), "runs.max_cost_usd", "finite"),
        ("runs.soft_thresholds", [0.9, 0.7], "runs.soft_thresholds", "must not exceed"),
        ("runs.soft_thresholds", [0.7, 1.5], "runs.soft_thresholds[1]", "(0, 1]"),
        ("runs.soft_thresholds", [0.5, 0.6, 0.7], "runs.soft_thresholds", "up to 2"),
        ("runs.loop.window", 1, "runs.loop.window", ">= 2"),
        ("runs.loop.window", 10_000, "runs.loop.window", "<= 256"),
        ("runs.loop.repeat_threshold", 30, "runs.loop.repeat_threshold", "exceeds window 20"),
        ("runs.loop.ignore_fields", "page", "runs.loop.ignore_fields", "list of strings"),
        ("runs.pause_freezes_deadline", "yes", "runs.pause_freezes_deadline", "true or false"),
        ("runs.reserve_s", 400, "runs.reserve_s", "below deadline_s 300"),
        ("tenants.acme.max_concurrent_runs", 0, "tenants.acme.max_concurrent_runs", ">= 1"),
        ("tenants.acme.rolling[0].metric", "dollars", "tenants.acme.rolling[0].metric", "cost_usd"),
        ("tenants.acme.rolling[1].limit", -1, "tenants.acme.rolling[1].limit", "must be > 0"),
        ("tenants.acme.rolling[1].window_s", "1h", "tenants.acme.rolling[1].window_s", "number"),
        (
            "tenants.acme.rolling[1]",
            {"metric": "tokens"},
            "tenants.acme.rolling[1].limit",
            "required",
        ),
        ("tenants.acme.rolling", {"metric": "tokens"}, "tenants.acme.rolling", "must be a list"),
        ("tenants.acme", [1], "tenants.acme", "must be a mapping"),
        ("prices.models.gpt-4.1.input", -2, "prices.models.gpt-4.1.input", ">= 0"),
        ("prices.version", "", "prices.version", "non-empty"),
        ("auth.admin_token_env", 3, "auth.admin_token_env", "non-empty string"),
        ("guard.max_tracked_runs", 0, "guard.max_tracked_runs", ">= 1"),
        ("guard.agent_grace_s", -1, "guard.agent_grace_s", ">= 0"),
        ("store.retention_days", 0, "store.retention_days", ">= 1"),
        ("presets.faq.max_stepz", 1, "presets.faq.max_stepz", "unknown key"),
    ],
)
def test_errors_name_the_key(path: str, value, error_path: str, needle: str) -> None:
    with pytest.raises(ConfigError) as exc:
        PolicyConfig.from_dict(_with(path, value))
    assert exc.value.path == error_path
    assert needle in str(exc.value)
    assert str(exc.value).startswith(error_path + ": ")


def test_top_level_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError, match="must be a mapping"):
        PolicyConfig.from_dict(["runs"])  # type: ignore[arg-type]


def test_auth_accepts_plain_env_names() -> None:
    cfg = PolicyConfig.from_dict({"auth": {"tenants": {"acme": "ACME_TOKEN"}}})
    assert cfg.auth == AuthConfig(None, {"acme": "ACME_TOKEN"})


@pytest.mark.parametrize(
    ("runs", "requested", "expected"),
    [
        ({"max_steps": 50}, Limits(max_steps=12), 12),  # decorator tightens
        ({"max_steps": 10}, Limits(max_steps=12), 10),  # ... and cannot loosen
        ({}, Limits(max_steps=12), 12),
        ({"max_steps": 50}, None, 50),
        ({"max_steps": 50}, Limits(), 50),  # None on the decorator side loses
    ],
)
def test_tightest_wins(runs, requested, expected) -> None:
    cfg = PolicyConfig.from_dict({"runs": runs})
    assert cfg.effective_limits(requested).max_steps == expected


def test_tightest_wins_every_field() -> None:
    cfg = PolicyConfig.from_dict(
        {
            "runs": {
                "max_tokens": 1000,
                "max_cost_usd": 1.0,
                "deadline_s": 60,
                "soft_thresholds": [0.7, 0.9],
                "loop": {"window": 20, "repeat_threshold": 3, "ignore_fields": ["page"]},
                "timeout_margin_s": 0.5,
            }
        }
    )
    req = Limits(
        max_tokens=5000,
        max_cost_usd=0.5,
        deadline_s=90,
        soft_thresholds=(0.5, 0.95),
        loop=LoopSettings(window=30, repeat_threshold=2, ignore_fields=("cursor",)),
        timeout_margin_s=1.0,
        pause_freezes_deadline=True,
    )
    eff = cfg.effective_limits(req)
    assert (eff.max_tokens, eff.max_cost_usd, eff.deadline_s) == (1000, 0.5, 60)
    assert eff.soft_thresholds == (0.5, 0.9)
    assert (eff.loop.window, eff.loop.repeat_threshold) == (20, 2)
    assert set(eff.loop.ignore_fields) == {"page", "cursor"}
    assert eff.timeout_margin_s == 1.0
    assert eff.pause_freezes_deadline is False  # the policy file did not allow freezing


@pytest.mark.parametrize("name", ["faq", "customer_service", "code_fix", "research", "browser"])
def test_presets_exist_and_tighten(name: str) -> None:
    p = PRESETS[name]
    assert p.max_steps is not None and p.deadline_s is not None and p.max_tool_calls is not None
    assert p.reserve_tokens is not None and p.reserve_tokens < p.max_tokens
    cfg = PolicyConfig.from_dict({"runs": {"max_steps": 20}})
    eff = cfg.effective_limits(preset=name)
    assert eff.max_steps == min(20, p.max_steps)
    assert eff.deadline_s == p.deadline_s


def test_presets_scale_with_the_task() -> None:
    steps = {k: PRESETS[k].max_steps for k in PRESETS}
    assert steps["faq"] < steps["customer_service"] < steps["code_fix"]
    assert steps["browser"] >= steps["code_fix"]
    # an FAQ is judged stuck soonest; code fixing keeps the seed defaults (test-fix cycles
    # are protected by the new-information exemption)
    assert PRESETS["faq"].loop.no_progress_steps < PRESETS["code_fix"].loop.no_progress_steps
    assert PRESETS["code_fix"].loop == LoopSettings()


def test_preset_override_and_new_preset() -> None:
    cfg = PolicyConfig.from_dict({"presets": {"faq": {"max_steps": 2}, "triage": {"max_steps": 7}}})
    assert cfg.presets["faq"].max_steps == 2
    assert cfg.presets["faq"].deadline_s == PRESETS["faq"].deadline_s  # other fields kept
    assert cfg.effective_limits(preset="triage").max_steps == 7
    with pytest.raises(ConfigError) as exc:
        cfg.effective_limits(preset="nope")
    assert exc.value.path == "preset"


# -- prices -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "inp", "out", "cached", "expected"),
    [
        ("gpt-4.1", 1_000_000, 0, 0, 2.0),
        ("gpt-4.1", 0, 1_000_000, 0, 8.0),
        ("gpt-4.1", 1_000_000, 0, 1_000_000, 0.5),  # all input cached
        ("gpt-4.1", 1_000_000, 100_000, 400_000, 1.2 + 0.2 + 0.8),
        ("gpt-4.1-2025-04-14", 1_000_000, 0, 0, 2.0),  # dated variant -> longest prefix
        ("gpt-4.1-mini", 1_000_000, 0, 0, 0.4),
        ("my-local-llama", 1000, 1000, 0, None),  # unpriced, never "free"
    ],
)
def test_price_book(model, inp, out, cached, expected) -> None:
    got = DEFAULT_PRICE_BOOK.cost_usd(
        model, input_tokens=inp, output_tokens=out, cached_tokens=cached
    )
    assert got == (None if expected is None else pytest.approx(expected))


def test_price_book_without_cached_rate_bills_input() -> None:
    cfg = PolicyConfig.from_dict(
        {"prices": {"version": 3, "models": {"m": {"input": 1, "output": 2}}}}
    )
    assert cfg.prices == PriceBook("3", cfg.prices.models)
    assert cfg.prices.cost_usd("m", input_tokens=10**6, output_tokens=0, cached_tokens=10**6) == 1.0


def test_redis_timeout_is_100_ms_unless_set_and_must_be_positive() -> None:
    assert PolicyConfig.from_dict(None).guard.redis_timeout_ms == 100.0
    cfg = PolicyConfig.from_dict({"guard": {"redis_timeout_ms": 2000}})
    assert cfg.guard.redis_timeout_ms == 2000.0
    for bad in (0, -5, "fast", float("nan")):
        with pytest.raises(ConfigError, match="redis_timeout_ms"):
            PolicyConfig.from_dict({"guard": {"redis_timeout_ms": bad}})
