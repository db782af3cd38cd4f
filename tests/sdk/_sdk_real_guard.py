"""A real guard for the SDK tests: GuardServer on 127.0.0.1:0 in a thread of its own."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def guard_in_thread(policy: dict[str, Any], **server_kw: Any) -> Iterator[dict[str, Any]]:
    """A real guard (GuardServer on 127.0.0.1:0) on its own event-loop thread, as an agent
    process sees it (the SDK's client has its own loop too). Yields ``{"port", "sink"}``."""
    from guard.policy import PolicyConfig
    from guard.server import GuardServer, MemorySink

    box: dict[str, Any] = {"sink": MemorySink()}
    ready = threading.Event()

    async def serve() -> None:
        cfg = PolicyConfig.from_dict(policy)
        async with GuardServer(cfg, listen="127.0.0.1:0", sink=box["sink"], **server_kw) as srv:
            box["port"] = srv.port
            ready.set()
            while not box.get("stop"):
                await asyncio.sleep(0.02)

    th = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    th.start()
    assert ready.wait(20)
    try:
        yield box
    finally:
        box["stop"] = True
        th.join(10)
