"""A framework release that moved what its integration wraps: the integration stays off, with
nothing of it patched, and the others turn on (a ConfigError when it was named)."""

from __future__ import annotations

import logging

import pytest

import guard
from guard.errors import ConfigError

agents = pytest.importorskip("agents")
from agents import run as run_mod  # noqa: E402
from agents.run_internal import tool_execution  # noqa: E402

from guard.integrations import enabled  # noqa: E402


@pytest.fixture
def moved_seam(monkeypatch: pytest.MonkeyPatch) -> None:
    # what a later Agents SDK minor could do: rename its private tool invocation
    monkeypatch.delattr(tool_execution, "_invoke_function_tool_with_metadata")


def test_instrument_all_leaves_an_incompatible_framework_off_and_the_rest_on(
    moved_seam: None, caplog: pytest.LogCaptureFixture
) -> None:
    run_before = run_mod.AgentRunner.run
    with caplog.at_level(logging.WARNING, logger="guard.integrations"):
        on = guard.instrument()
    assert "openai_agents" not in on and "openai_agents" not in enabled()
    assert "openai" in on and "pydantic_ai" in on and "langchain" in on
    # nothing of it patched: the runner is the library's own
    assert run_mod.AgentRunner.run is run_before
    assert not hasattr(run_before, "__guard_original__")
    msg = " ".join(r.getMessage() for r in caplog.records)
    assert "openai_agents" in msg and "_invoke_function_tool_with_metadata" in msg, msg
    assert "0.24" in msg or "version unknown" in msg  # the release it found


def test_instrument_by_name_is_a_config_error_naming_what_moved(moved_seam: None) -> None:
    run_before = run_mod.AgentRunner.run
    with pytest.raises(ConfigError, match="_invoke_function_tool_with_metadata"):
        guard.instrument("openai_agents")
    assert run_mod.AgentRunner.run is run_before
    assert "openai_agents" not in enabled()
    # the client layer it would have turned on as its dependency is off again
    assert "openai" not in enabled()
