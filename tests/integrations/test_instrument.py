"""``guard.instrument()``: the registry, idempotence, unknown names, and no import of the
libraries by ``import guard``."""

from __future__ import annotations

import subprocess
import sys

import pytest
from openai.resources.chat.completions import completions as chat
from openai.resources.responses import responses

import guard
from guard.integrations import KNOWN


def test_import_guard_imports_no_integration_library() -> None:
    code = (
        "import sys, guard; guard.run; guard.step; guard.instrument; "
        "libs = [m for m in ('openai', 'agents', 'pydantic_ai', 'langchain_core', 'langgraph') "
        "if m in sys.modules]; print(','.join(libs))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_instrument_turns_on_the_importable_ones_once_and_uninstrument_restores() -> None:
    original = chat.Completions.__dict__["create"], responses.AsyncResponses.__dict__["create"]
    first = guard.instrument()
    assert "openai" in first
    wrapped = chat.Completions.__dict__["create"]
    # the original, or (another instrumentation's wrapper left in place by an earlier test)
    # the original called bound (guard.integrations._client._bound)
    inner = wrapped.__guard_original__
    assert wrapped is not original[0] and original[0] in (
        inner,
        getattr(inner, "__wrapped__", None),
    )
    assert guard.instrument() == first  # idempotent: the same names, nothing wrapped twice
    assert guard.instrument("openai") == ["openai"]
    assert chat.Completions.__dict__["create"] is wrapped
    assert guard.uninstrument() == list(reversed(first))
    assert (chat.Completions.__dict__["create"], responses.AsyncResponses.__dict__["create"]) == (
        original
    )


def test_an_unknown_name_is_a_config_error_listing_the_known_ones() -> None:
    with pytest.raises(guard.ConfigError) as err:
        guard.instrument("openai", "crewai")
    assert "'crewai'" in str(err.value)
    for name in KNOWN:
        assert name in str(err.value)
    assert guard.integrations.enabled() == []


def test_the_names_of_the_design_contract_turn_on() -> None:
    """DESIGN §3.1 names them so; ``langgraph`` is an alias of ``langchain``."""
    names = ("openai", "openai_agents", "pydantic_ai", "langchain")
    try:
        assert guard.instrument(*names) == list(names)
        assert guard.instrument("langgraph") == ["langchain"]
    finally:
        assert set(guard.uninstrument()) == set(names)
