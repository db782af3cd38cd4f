"""Channels to a guard: TLS per the settings, keepalive, and a connect that fails fast."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import grpc

from guard.sdk._export import channel_credentials

if TYPE_CHECKING:  # pragma: no cover
    from guard.sdk._config import Settings
    from guard.sdk._targets import Address

__all__ = ["open_channel", "wait_connected"]


def open_channel(settings: Settings, addr: Address) -> grpc.aio.Channel:
    """A channel to one guard address; the same TLS settings for every guard, the TLS files
    read now (rotated files take effect at each reconnect)."""
    opts = [("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000)]
    opts += addr.channel_options()
    if settings.secure:
        creds = channel_credentials(settings)
        return grpc.aio.secure_channel(addr.target, creds, options=opts)
    return grpc.aio.insecure_channel(addr.target, options=opts)


async def wait_connected(channel: grpc.aio.Channel, timeout_s: float) -> None:
    """Wait for the channel to connect: a refused connect (a dead guard) fails at once, one
    that stays silent (a hung guard, a black-holed address) after ``timeout_s``. grpc's own
    ``channel_ready()`` would wait through its reconnect backoff instead."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    ready, failed = grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.TRANSIENT_FAILURE
    state = channel.get_state(try_to_connect=True)
    while state is not ready:
        if state in (failed, grpc.ChannelConnectivity.SHUTDOWN):
            raise ConnectionError(f"cannot connect ({state.name})")
        left = deadline - loop.time()
        if left <= 0:
            raise ConnectionError(f"no connection within {timeout_s:g} s ({state.name})")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(channel.wait_for_state_change(state), left)
        state = channel.get_state(try_to_connect=True)
