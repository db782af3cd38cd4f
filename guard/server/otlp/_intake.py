"""The span intake: a bounded, per-tenant fair queue between the span receivers and the applier.

Both OTLP transports hand every Export request to :meth:`SpanIntake.export`. Nothing about a
request is decoded or applied in the receiver's own handler: it is admitted (or shed) in O(1)
by its size, queued under its tenant, and one worker task on the guard's event loop decodes
and applies the queued requests a slice (at most :data:`SLICE_SPANS` spans) at a time, taking
the tenants with queued work in turn. Once its steps have taken :data:`TURN_BUDGET_S` the
worker yields to the loop, so a control message (a cancel, an allowance answer, a health
check) waits about that long at most, however many span requests are in flight, and one
tenant's flood delays another tenant's spans by one slice per tenant, not by the flood.

Admission is by bytes, a request counting at least :data:`MIN_COST_BYTES` (so a flood of tiny
requests is bounded too). With ``cap`` the configured queue size and ``n`` the tenants with
queued work (counting the caller), a request is admitted when its tenant's queued bytes stay
within ``cap / n`` and the total within ``2 × cap``; a tenant with nothing queued may queue one
request of any size while the total is within ``2 × cap`` (so the queue holds at most that
plus one request). Beyond that the request is refused with :class:`Overloaded` and a retry
delay (gRPC ``RESOURCE_EXHAUSTED`` with ``RetryInfo``, HTTP 429 with ``Retry-After``), which
OTLP exporters retry: shed spans arrive late, not never. A tenant that floods is therefore
shed first and alone, and no tenant's queue can crowd out another's.

A request is still applied whole or not at all: every slice is decoded (so validated) before
the first is applied. A request whose caller went away (its deadline passed, the exporter
will resend it) before the worker reached it is dropped unapplied, so the resend is not
counted twice. What overload does to budgets: spans shed or queued are usage the guard has not
seen yet; budgets enforced from spans alone (after-the-fact model calls without a control
stream) may pass their limit by what is queued. Reservations and allowances go over the
control stream, which no span load delays, so reserved budgets stay exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from guard.errors import GuardError, GuardUnavailable
from guard.server.decode._decode import decode_slices
from guard.server.runtime import _gc, _memtrim
from guard.server.runtime._status import Overloaded

__all__ = ["MIN_COST_BYTES", "SLICE_SPANS", "TURN_BUDGET_S", "SpanIntake"]

log = logging.getLogger("guard.server")

SLICE_SPANS = 128  # spans decoded or applied in one step (a step of new runs: ~1-2 ms)
TURN_BUDGET_S = 0.001  # steps taken in one turn of the event loop, until this has passed
TRIM_AFTER_BYTES = 16 << 20  # a burst this large is followed by a trim once ingest is quiet
QUIET_S = 0.5  # no span request for this long: ingest is quiet
MIN_COST_BYTES = 4096  # what a request counts at least against its tenant's share
RETRY_AFTER_S = 1.0  # the retry delay a shed request is given (the queue drains in less)

Result = tuple[int, list[str]]  # (rejected spans, the first error texts)


class _Job:
    """One admitted request: its bytes until decoded, then its slices until applied."""

    __slots__ = (
        "cost",
        "data",
        "decoded",
        "errors",
        "future",
        "parts",
        "principal",
        "queued",
        "rejected",
    )

    def __init__(self, data: bytes, principal: Any, cost: int, future: asyncio.Future) -> None:
        self.data: bytes | None = data
        self.principal = principal
        self.cost = cost
        self.future = future
        self.parts: Iterator[Any] | None = None  # the slices still to decode
        self.decoded: deque[Any] = deque()  # the slices decoded, until applied
        self.rejected = 0
        self.errors: list[str] = []
        self.queued = time.monotonic()


class SpanIntake:
    """Admits, queues and applies span requests (see the module docstring).

    ``apply(decoded, principal) -> (rejected, errors)`` applies one decoded slice (the
    registry's ``ingest``); it runs only in the worker task, on the loop that called
    :meth:`start`. ``cap_bytes`` is the queue's size (``guard.max_queued_span_bytes``);
    ``turn_budget_s``: how long the worker may hold the loop (0: one step per turn).
    Counters (``span_requests_shed``, ``span_bytes_shed``, ``span_requests_abandoned``) go in
    ``stats``; :meth:`figures` adds the queue's current size and the longest wait so far.
    """

    def __init__(
        self,
        apply: Callable[[Any, Any], Result],
        cap_bytes: int,
        stats: dict[str, int],
        *,
        slice_spans: int = SLICE_SPANS,
        turn_budget_s: float = TURN_BUDGET_S,
    ) -> None:
        if cap_bytes < MIN_COST_BYTES:
            raise ValueError(f"cap_bytes {cap_bytes} is below one request ({MIN_COST_BYTES})")
        self._apply = apply
        self.cap_bytes = cap_bytes
        self.stats = stats
        self._slice = slice_spans
        self._budget_s = turn_budget_s
        self._queues: dict[str | None, deque[_Job]] = {}  # tenants with queued work
        self._turns: deque[str | None] = deque()  # those tenants, in the order they are served
        self._held: dict[str | None, int] = {}  # tenant -> queued bytes
        self._total = 0
        self._since_trim = 0  # bytes of requests done since the last trim
        self._shedding = False  # shed since ingest was last quiet (see _gc.overloaded)
        self._wait_ms = 0.0  # the longest a request waited for the worker to reach it
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        for key in (
            "span_requests_shed",
            "span_bytes_shed",
            "span_requests_abandoned",
            "frozen_reclaimed",
        ):
            stats.setdefault(key, 0)

    # -- the receivers' side ----------------------------------------------------------------
    async def export(self, data: bytes, principal: Any) -> Result:
        """Admit, queue and await one serialized ``ExportTraceServiceRequest`` of
        ``principal``. Raises :class:`Overloaded` when its tenant's share is full,
        ``InvalidInput`` when the request is malformed (nothing of it applied), and
        ``GuardUnavailable`` when the intake stops before reaching it."""
        if self._task is None:
            raise GuardUnavailable("the span intake is not running")
        tenant = principal.tenant
        cost = max(len(data), MIN_COST_BYTES)
        self._admit(tenant, cost)
        job = _Job(data, principal, cost, asyncio.get_running_loop().create_future())
        queue = self._queues.get(tenant)
        if queue is None:
            queue = self._queues[tenant] = deque()
            self._turns.append(tenant)
        queue.append(job)
        self._held[tenant] = self._held.get(tenant, 0) + cost
        self._total += cost
        assert self._wake is not None
        self._wake.set()
        # The caller's cancellation (its deadline passed) cancels the future: the worker then
        # drops the job if it has not started applying it (see _step).
        return await job.future

    def _admit(self, tenant: str | None, cost: int) -> None:
        refusal = self.refusal(tenant, cost)
        if refusal is not None:
            self.count_shed(1, cost)
            raise refusal

    def refusal(self, tenant: str | None, size: int) -> Overloaded | None:
        """The :class:`Overloaded` a request of ``size`` bytes of ``tenant`` would get now,
        or ``None``; changes nothing. A receiver in another thread may ask before it reads a
        body it would only have to refuse (a racy read: :meth:`export` decides again)."""
        cost = max(size, MIN_COST_BYTES)
        held = self._held.get(tenant, 0)
        active = len(self._queues) + (tenant not in self._queues)
        share = self.cap_bytes / active
        if held == 0 and self._total <= 2 * self.cap_bytes:
            return None  # one request per tenant, however large, while the queue has room
        if held + cost <= share and self._total + cost <= 2 * self.cap_bytes:
            return None
        who = "the guard" if tenant is None else f"tenant {tenant!r}"
        return Overloaded(
            f"span intake full: {who} has {held} bytes of spans queued, its share is "
            f"{int(share)} of {self.cap_bytes} ({active} tenants with spans queued, "
            f"{self._total} bytes in all); retry in {RETRY_AFTER_S:g} s",
            retry_after_s=RETRY_AFTER_S,
        )

    def count_shed(self, requests: int, size: int) -> None:
        """Count shed requests (also those a receiver refused after :meth:`refusal`); on the
        intake's loop. While load is shed, the collector runs small (see ``_gc``)."""
        self.stats["span_requests_shed"] += requests
        self.stats["span_bytes_shed"] += max(size, MIN_COST_BYTES * requests)
        if not self._shedding:
            self._shedding = True
            _gc.overloaded(True)

    # -- the worker -------------------------------------------------------------------------
    def start(self) -> None:
        """Start the worker on the running loop."""
        self._wake = asyncio.Event()
        self._task = asyncio.ensure_future(self._work())

    async def stop(self) -> None:
        """Stop the worker; requests still queued get ``GuardUnavailable`` (the receivers
        have drained what they could before this)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for queue in self._queues.values():
            for job in queue:
                if not job.future.done():
                    job.future.set_exception(GuardUnavailable("guard is stopping; retry"))
        self._queues.clear()
        self._turns.clear()
        self._held.clear()
        self._total = 0

    def figures(self) -> dict[str, float]:
        """The queue's current bytes and tenants, and the longest wait so far (ms)."""
        return {
            "span_queue_bytes": float(self._total),
            "span_queue_tenants": float(len(self._queues)),
            "span_queue_wait_max_ms": self._wait_ms,
            "memory_trims": float(_memtrim.stats["trims"]),
        }

    async def _work(self) -> None:
        assert self._wake is not None
        turn = time.perf_counter()
        while True:
            if not self._turns:
                self._wake.clear()
                if self._since_trim >= TRIM_AFTER_BYTES or self._shedding:
                    await self._quiet()
                else:
                    await self._wake.wait()
                turn = time.perf_counter()
                continue
            tenant = self._turns.popleft()
            queue = self._queues[tenant]
            job = queue[0]
            try:
                finished = self._step(job)
            except GuardError as exc:  # a malformed request: refused whole, nothing applied
                finished = self._fail(job, exc)
            except Exception as exc:  # a bug must fail one request, never the worker
                log.exception("span intake: applying a request failed")
                finished = self._fail(job, GuardError(f"internal error: {exc!r}"))
            if finished:
                queue.popleft()
                self._release(tenant, job.cost)
            if queue:
                self._turns.append(tenant)
            else:
                del self._queues[tenant]
            now = time.perf_counter()
            if now - turn >= self._budget_s:  # the loop's turn: control comes first
                await asyncio.sleep(0)
                turn = time.perf_counter()

    async def _quiet(self) -> None:
        """Wait for work; when none comes within :data:`QUIET_S`, the overload is over (the
        collector's usual settings again), and after a burst the memory its requests used
        goes back to the operating system: first the garbage the collector froze while it
        was alive (``_gc.reclaim_frozen``), then what the allocator keeps (hundreds of MB
        after a flood; the trim runs in a thread, off the loop)."""
        assert self._wake is not None
        try:
            await asyncio.wait_for(self._wake.wait(), QUIET_S)
        except TimeoutError:
            if self._shedding:
                self._shedding = False
                _gc.overloaded(False)
            if self._since_trim >= TRIM_AFTER_BYTES:  # once per burst, while quiet
                self._since_trim = 0
                self.stats["frozen_reclaimed"] += _gc.reclaim_frozen()
                await asyncio.to_thread(_memtrim.after_burst)

    def _release(self, tenant: str | None, cost: int) -> None:
        self._since_trim += cost
        self._total -= cost
        held = self._held[tenant] - cost
        if held:
            self._held[tenant] = held
        else:
            del self._held[tenant]

    def _step(self, job: _Job) -> bool:
        """One slice of ``job``'s work (decode one slice, or apply one); True when it is done.

        A request of one slice (the usual case) is decoded and applied in one step."""
        if job.parts is None and not job.decoded:  # not started: its caller may have gone
            if job.future.cancelled():
                self.stats["span_requests_abandoned"] += 1
                return True
            self._wait_ms = max(self._wait_ms, (time.monotonic() - job.queued) * 1000.0)
            assert job.data is not None
            job.parts = decode_slices(job.data, self._slice)
            job.data = None
            first = next(job.parts, None)
            second = next(job.parts, None) if first is not None else None
            if second is None:  # whole in one slice: apply it now
                job.parts = None
                if first is not None:
                    job.rejected, job.errors = self._apply(first, job.principal)
                return self._resolve(job)
            job.decoded = deque((first, second))
            return False
        if job.parts is not None:  # still decoding: every slice before any is applied
            part = next(job.parts, None)
            if part is None:
                job.parts = None
                if job.future.cancelled():  # nothing applied yet: the resend will be
                    self.stats["span_requests_abandoned"] += 1
                    return True
            else:
                job.decoded.append(part)
            return False
        r, e = self._apply(job.decoded.popleft(), job.principal)
        job.rejected += r
        job.errors.extend(e[: max(0, 5 - len(job.errors))])
        return self._resolve(job) if not job.decoded else False

    @staticmethod
    def _fail(job: _Job, exc: BaseException) -> bool:
        job.parts, job.data = None, None
        job.decoded.clear()
        if not job.future.done():
            job.future.set_exception(exc)
        return True

    @staticmethod
    def _resolve(job: _Job) -> bool:
        if not job.future.done():
            job.future.set_result((job.rejected, job.errors))
        return True
