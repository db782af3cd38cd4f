"""configure(): arguments > environment > defaults; unknown keys and bad values rejected."""

from __future__ import annotations

import pytest

import guard
from guard.errors import ConfigError
from guard.sdk import get_settings


def test_environment_is_read_and_arguments_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_GUARD_TENANT", "env-tenant")
    monkeypatch.setenv("OTEL_GUARD_HMAC_KEY", "env-key-123456")
    monkeypatch.setenv("OTEL_GUARD_TOKEN", "env-token")
    s = guard.configure()
    assert s.tenant == "env-tenant" and s.hmac_key == b"env-key-123456" and s.token == "env-token"
    assert s.local_only
    s = guard.configure(tenant="arg-tenant")
    assert s.tenant == "arg-tenant" and s.token == "env-token"
    assert get_settings() is s


def test_secrets_stay_out_of_repr() -> None:
    s = guard.configure(token="sekret-token", hmac_key=b"sekret-hmac-key")
    assert "sekret" not in repr(s)


def test_defaults_without_configure() -> None:
    s = get_settings()
    assert s.endpoint is None and s.tenant == "default" and s.disabled is False
    assert s.admit_timeout_ms == 200


def test_unknown_key_and_bad_values_are_config_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError) as info:
        guard.configure(endpont="127.0.0.1:4317")
    assert info.value.path == "endpont"
    with pytest.raises(ConfigError, match="host:port"):
        guard.configure(endpoint="localhost")
    with pytest.raises(ConfigError, match="admit_timeout_ms"):
        guard.configure(admit_timeout_ms=-5)
    monkeypatch.setenv("OTEL_GUARD_DISABLED", "maybe")
    with pytest.raises(ConfigError, match="OTEL_GUARD_DISABLED"):
        guard.configure()


def test_endpoint_target_and_tls() -> None:
    s = guard.configure(endpoint="https://guard.example:4317", disabled=True)
    assert s.target == "guard.example:4317" and s.secure


def test_disabled_mode_is_a_pass_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_GUARD_DISABLED", "1")

    @guard.run(agent="a", max_steps=1)
    def f(x: int) -> int:
        for _ in range(5):  # way past max_steps: nothing is enforced
            with guard.step() as step:
                step.model_call(model="gpt-4.1", input_tokens=1)
        assert not guard.current_run()
        return x * 2

    @guard.run(agent="b", max_steps=1)
    async def g() -> str:
        return "async"

    assert f(21) == 42
    import asyncio

    assert asyncio.run(g()) == "async"


def test_span_export_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    s = guard.configure(endpoint="guard:4317", disabled=True)
    assert (s.span_export, s.span_target) == ("direct", "guard:4317")
    s = guard.configure(
        endpoint="guard:4317", span_endpoint="https://collector:4317", disabled=True
    )
    assert s.span_target == "collector:4317" and s.span_secure and not s.secure
    assert s.target == "guard:4317"  # the control stream stays direct
    monkeypatch.setenv("OTEL_GUARD_SPAN_EXPORT", " None ")
    s = guard.configure(endpoint="guard:4317", disabled=True)
    assert s.span_export == "none" and s.span_target is None and s.target == "guard:4317"
    monkeypatch.setenv("OTEL_GUARD_SPAN_EXPORT", "direct")
    monkeypatch.setenv("OTEL_GUARD_SPAN_ENDPOINT", "collector:4317")
    assert guard.configure(disabled=True).span_target == "collector:4317"
    with pytest.raises(ConfigError) as info:
        guard.configure(span_export="collector")
    assert info.value.path == "span_export" and "direct, none" in str(info.value)
    with pytest.raises(ConfigError) as info:
        guard.configure(span_export="none")  # span_endpoint still comes from the environment
    assert info.value.path == "span_endpoint"
    with pytest.raises(ConfigError, match="host:port") as info:
        guard.configure(span_endpoint="collector")
    assert info.value.path == "span_endpoint"
