"""Fixtures for the integration tests: a clean SDK, a span sink, the scripted LLM server, and
the integrations turned off again after each test (``guard.uninstrument()``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _llm_server import LLMServer  # pytest puts this directory on sys.path (rootdir, prepend)

import guard
from guard.sdk._api import reset
from guard.sdk._config import ENV
from guard.testing import SpanSink, capture_spans


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    reset()
    yield
    guard.uninstrument()
    guard.shutdown()
    reset()


@pytest.fixture
def sink() -> Iterator[SpanSink]:
    with capture_spans(hmac_key=b"test-key-0123456789") as s:
        yield s


@pytest.fixture
def llm() -> Iterator[LLMServer]:
    """A started server; set ``llm.script`` in the test (default: one text reply)."""
    with LLMServer() as server:
        yield server
