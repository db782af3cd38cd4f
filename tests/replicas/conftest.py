"""Fixtures of the replica tests: a real redis-server per module, flushed per test, and
several real ``GuardServer`` replicas sharing it (in this process, each its own grpc server
on 127.0.0.1:0)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from redisstate._server import RedisServer
from server.conftest import config

from guard.server import GuardServer, MemorySink
from guard.v1 import guard_pb2_grpc


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
    return redis_server.url


class Fleet:
    """Replicas ``x``, ``y``, ``z`` (each with its own MemorySink) sharing one Redis."""

    def __init__(self) -> None:
        self.servers: dict[str, GuardServer] = {}
        self.sinks: dict[str, MemorySink] = {}
        self._stack = contextlib.AsyncExitStack()

    async def start(self, url: str, names: str, **policy: Any) -> None:
        for name in names:
            sink = MemorySink()
            srv = GuardServer(
                config(**policy), listen="127.0.0.1:0", sink=sink, guard_id=name, redis_url=url
            )
            await self._stack.enter_async_context(srv)
            self.servers[name], self.sinks[name] = srv, sink

    def __getitem__(self, name: str) -> GuardServer:
        return self.servers[name]

    def admin(self, name: str) -> guard_pb2_grpc.GuardAdminStub:
        channel = grpc.aio.insecure_channel(self.servers[name].address)
        self._stack.push_async_callback(channel.close)
        return guard_pb2_grpc.GuardAdminStub(channel)

    async def close(self) -> None:
        await self._stack.aclose()


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    f = Fleet()
    try:
        yield f
    finally:
        await f.close()
