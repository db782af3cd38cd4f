"""The agent's half of tenant allowances: ``AllowanceRequest`` up, ``Allowance`` down.

One :class:`AllowanceDesk` per control client. It keeps the requests waiting for an answer
and applies the guard's ceilings to the root run they name; the stream itself (sending,
the connection state, the run table) stays the :class:`~guard.sdk._control.ControlClient`'s.
Thread-safe: requests come from agent threads, answers from the control thread.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from typing import TYPE_CHECKING, Any

from guard.v1 import guard_pb2 as pb
from guard.wire import usage_to_pb

if TYPE_CHECKING:  # pragma: no cover
    from guard.sdk._control import ControlClient
    from guard.sdk._run import LiveRun

__all__ = ["MAX_ALLOWANCE_WAITS", "AllowanceDesk"]

MAX_ALLOWANCE_WAITS = 10_000  # outstanding AllowanceRequests; past it a request fails open


class AllowanceDesk:
    """Outstanding allowance requests of one control client, and the answers to them."""

    def __init__(self, client: ControlClient) -> None:
        self._client = client
        # request_id -> (future resolved with the run's new Ceilings, stop if exhausted)
        self._waits: dict[int, tuple[concurrent.futures.Future[Any], bool]] = {}

    def request(
        self, root: LiveRun, cost_usd: float, tokens: int, *, stop_if_exhausted: bool = False
    ) -> concurrent.futures.Future[Any] | None:
        """Send an ``AllowanceRequest`` for ``root`` (at least this much more). Returns a
        future resolved with the run's new :class:`~guard.sdk._reserve.Ceilings` (``None``
        if the stream drops first), or ``None`` when the guard is not connected now.
        ``stop_if_exhausted``: an ``exhausted`` answer makes the run's stop pending even when
        nobody waits for it any more."""
        client = self._client
        if not client.connected.is_set():
            return None
        rid = client.next_request_id()
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with client._lock:
            if len(self._waits) >= MAX_ALLOWANCE_WAITS:
                return None
            self._waits[rid] = (fut, stop_if_exhausted)
        client.counters["allowance_requests"] += 1
        req = pb.AllowanceRequest(
            run_id=root.run_id,
            request_id=rid,
            cost_usd=cost_usd,
            tokens=tokens,
            usage=usage_to_pb(root.budget.usage()),
        )
        client._send(pb.AgentMessage(allowance_request=req))
        fut.add_done_callback(lambda f, rid=rid: self._forget(rid))  # type: ignore[misc]  # a lambda's default
        return fut

    def _forget(self, rid: int) -> None:
        with self._client._lock:
            self._waits.pop(rid, None)

    def on_reject(self, request_id: int) -> None:
        """The guard refused the AllowanceRequest ``request_id``: its waiter gets ``None``
        (no new ceilings: the call goes on as if the guard had not answered)."""
        with self._client._lock:
            wait = self._waits.pop(request_id, None)
        if wait is not None and not wait[0].done():
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                wait[0].set_result(None)

    def on_allowance(self, a: pb.Allowance) -> None:
        """Guard -> agent: the root run's ceilings (latest wins; ttl 0 = fall back now)."""
        from guard.sdk._reserve import Ceilings, pending_tenant_stop

        client = self._client
        with client._lock:
            run = client.live_run(a.run_id)
            wait = self._waits.pop(a.request_id, None) if a.request_id else None
        ceil = Ceilings(
            a.max_cost_usd if a.HasField("max_cost_usd") else None,
            a.max_tokens if a.HasField("max_tokens") else None,
            a.ttl_s,
            a.exhausted,
            a.detail,
        )
        if run is not None and run.live:
            run.allowance = ceil
            if a.exhausted:
                client.counters["allowance_exhausted"] += 1
                if wait is not None and (wait[1] or wait[0].done()):
                    pending_tenant_stop(run, a.detail)
        if wait is not None and not wait[0].done():
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                wait[0].set_result(ceil)
