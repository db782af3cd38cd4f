"""Fixtures of the replica tests: a real redis-server per module, flushed per test, and
several real ``GuardServer`` replicas sharing it (in this process, each its own grpc server
on 127.0.0.1:0)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from redisstate.conftest import redis_server, redis_url  # noqa: F401 (the same fixtures)
from server.conftest import config

from guard.server import GuardServer, MemorySink
from guard.v1 import guard_pb2_grpc


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
