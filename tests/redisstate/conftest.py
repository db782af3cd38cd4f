"""Fixtures of the Redis tests: a real redis-server per test module, flushed per test."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator

import pytest

from guard.server._redis import StateClient

from ._server import RedisServer

_n = itertools.count()


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path_factory.mktemp("redis"))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    if redis_server.proc is None:  # a test stopped it
        redis_server.start()
    redis_server.command("FLUSHALL")
    redis_server.command("SCRIPT", "FLUSH")  # each test starts as on a new server, in any order
    return redis_server.url


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[StateClient]:
    c = StateClient(redis_url, socket_timeout_ms=5000)  # a loaded CI machine, not a dead Redis
    try:
        yield c
    finally:
        await c.aclose()


@pytest.fixture
def tenant() -> str:
    return f"t{next(_n)}"
