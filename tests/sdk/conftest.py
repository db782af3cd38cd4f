"""Fixtures for the SDK tests: a clean environment and an in-memory span sink per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from guard.sdk._api import reset
from guard.sdk._clock import ManualClock
from guard.sdk._config import ENV
from guard.testing import SpanSink, capture_spans


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    reset()
    yield
    reset()


@pytest.fixture
def sink() -> Iterator[SpanSink]:
    with capture_spans(hmac_key=b"test-key-0123456789") as s:
        yield s


@pytest.fixture
def clock() -> ManualClock:
    """The SDK's clock for deadline and pause tests: time moves only by ``clock.advance``."""
    return ManualClock()


@pytest.fixture
def clocked_sink(clock: ManualClock) -> Iterator[SpanSink]:
    """``sink``, with the SDK on ``clock``."""
    with capture_spans(hmac_key=b"test-key-0123456789", clock=clock) as s:
        yield s
