"""Fixtures for the integration tests: a clean SDK, a span sink, the scripted LLM server, a
real guard, and the integrations turned off again after each test (``guard.uninstrument()``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _leftovers import leftovers, unwrap_leftovers
from _llm_server import LLMServer  # pytest puts this directory on sys.path (rootdir, prepend)

import guard
from guard.policy import PolicyConfig
from guard.sdk._api import reset
from guard.sdk._config import ENV
from guard.server import MemorySink, ServerThread
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
    left = leftovers()
    unwrap_leftovers()  # the next test starts clean, whatever this one left
    assert not left, f"instrumentation wrappers left on the client classes: {left}"


@pytest.fixture
def sink() -> Iterator[SpanSink]:
    with capture_spans(hmac_key=b"test-key-0123456789") as s:
        yield s


@pytest.fixture
def llm() -> Iterator[LLMServer]:
    """A started server; set ``llm.script`` in the test (default: one text reply)."""
    with LLMServer() as server:
        yield server


@pytest.fixture
def server() -> Iterator[tuple[ServerThread, MemorySink]]:
    """A real guard on 127.0.0.1:0 (default policy, records in a MemorySink), the SDK
    configured to it."""
    sink = MemorySink()
    with ServerThread(PolicyConfig.from_dict(None), sink=sink) as srv:
        guard.configure(endpoint=srv.address, admit_timeout_ms=3000)
        yield srv, sink
        guard.shutdown()
