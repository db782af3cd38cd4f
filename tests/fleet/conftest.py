"""Fixtures of the fleet tests: a real redis-server per test (see ``_fleet.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from redisstate._server import RedisServer


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
