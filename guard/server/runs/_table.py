"""The run table: every run this guard tracks, and the indexes over them.

One :class:`RunTable` per registry. It owns the maps (by run id, by trace, by tenant; the
detached and span-only runs), the capacity (``max_tracked_runs``), the bounded memory of
ended run ids, and the count of spans that provisional runs hold; every change to them goes
through its methods, so the indexes always agree.

Capacity is shared out per tenant. Each tenant's share is the cap over the tenants tracked.
At the cap, a new run takes the place of a span-only run (one without an agent to answer to):
of the tenant holding the most span-only runs when that tenant is over its share and the new
run's tenant is within its own, else of its own tenant. So one tenant's flood of made-up run
ids only ever displaces that tenant's runs, and it cannot lock another tenant out by filling
the table either. A run with an agent (registered over a control stream) is never displaced.
Each tenant's span-only runs are kept in an LRU (least recently heard from first,
:meth:`RunTable.touch`), so the run to displace is found in O(1), not by a scan of the runs.

Readers may look at the maps (read-only ``Mapping`` views by convention: the span path reads
``runs`` and ``by_trace`` once per span). Nothing here decides, delivers or writes a record.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from guard.server.runtime._ordered import OrderedSet
from guard.server.runtime._status import UnknownRun

if TYPE_CHECKING:  # pragma: no cover
    from guard.server.decode._schema import Observation
    from guard.server.runs._state import RunState
    from guard.server.runtime._auth import Principal

__all__ = [
    "ENDED_MEMORY",
    "MAX_RATE_TENANTS",
    "PROVISIONAL_SPANS_MAX",
    "PROVISIONAL_SPANS_TOTAL",
    "NewRunRate",
    "RunTable",
]

ENDED_MEMORY = 20_000  # ended run ids remembered to drop late spans and duplicate RunEnded
PROVISIONAL_SPANS_MAX = 256  # spans a provisional run keeps until its agent registers it
# ... and all provisional runs together (~330 B each: ~65 MB), so numbered spans of made-up
# run ids cannot grow the guard without bound
PROVISIONAL_SPANS_TOTAL = 200_000
MAX_RATE_TENANTS = 10_000  # tenants whose new-run rate is remembered


class NewRunRate:
    """How fast each tenant may make runs from spans alone: a token bucket per tenant of
    ``per_s`` runs a second, holding a second's worth (``None``: no limit).

    A flood of spans naming made-up run ids otherwise costs the guard a run's state per span
    (and the collector's time to scan it): refusing the span instead costs next to nothing.
    At most :data:`MAX_RATE_TENANTS` tenants' buckets are kept (the least recently used go:
    a forgotten bucket starts full again, so forgetting never refuses anyone)."""

    def __init__(self, per_s: float | None, clock: Callable[[], float]) -> None:
        self.per_s = per_s
        self.clock = clock
        self._buckets: OrderedDict[str, list[float]] = OrderedDict()  # [tokens, at]

    def _tokens(self, tenant: str) -> list[float] | None:
        if self.per_s is None:
            return None
        b = self._buckets.get(tenant)
        now = self.clock()
        if b is None:
            b = self._buckets[tenant] = [max(1.0, self.per_s), now]
            if len(self._buckets) > MAX_RATE_TENANTS:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(tenant)
            b[0] = min(max(1.0, self.per_s), b[0] + (now - b[1]) * self.per_s)
            b[1] = now
        return b

    def allows(self, tenant: str) -> bool:
        """Whether a new run of ``tenant`` would be allowed now (nothing taken)."""
        b = self._tokens(tenant)
        return b is None or b[0] >= 1.0

    def take(self, tenant: str) -> bool:
        """Take one new run of ``tenant``; False when its rate is spent."""
        b = self._tokens(tenant)
        if b is None:
            return True
        if b[0] < 1.0:
            return False
        b[0] -= 1.0
        return True


class RunTable:
    """The tracked runs of one guard and their indexes (see the module docstring).

    ``new_span_runs_per_s`` and ``clock``: the :class:`NewRunRate` of runs made from spans."""

    def __init__(
        self,
        max_runs: int,
        new_span_runs_per_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_runs = int(max_runs)
        self.span_run_rate = NewRunRate(new_span_runs_per_s, clock)
        self.runs: dict[str, RunState] = {}
        self.by_trace: dict[bytes, RunState] = {}  # the outermost run of each trace
        self.by_tenant: dict[str, OrderedSet[str]] = {}  # each in admission order
        self.detached: dict[str, RunState] = {}  # agent stream dropped, within the grace
        self.span_only: dict[str, RunState] = {}  # no control stream (or not yet)
        # the same runs by tenant, least recently heard from first (see touch): a plain
        # OrderedDict per tenant, as the native applier never reads these
        self.idle: dict[str, OrderedDict[str, RunState]] = {}
        self.ended: OrderedDict[str, None] = OrderedDict()
        self.provisional_spans = 0  # spans held by all provisional runs

    # -- admission -----------------------------------------------------------------------
    def full(self) -> bool:
        """At ``max_tracked_runs``: a new run needs room first (:meth:`room_from`)."""
        return len(self.runs) >= self.max_runs

    def has_room(self, tenant: str) -> bool:
        """Whether a new run of ``tenant`` could be made from its spans now: within the
        tenant's rate (:class:`NewRunRate`), and below the cap or a span-only run could make
        room for it (:meth:`room_from`). Takes nothing."""
        if not self.span_run_rate.allows(tenant):
            return False
        return len(self.runs) < self.max_runs or self.room_from(tenant) is not None

    def room_from(self, tenant: str) -> RunState | None:
        """At the cap: the span-only run to forget for a new run of ``tenant``, or ``None``.

        The stalest of the tenant with the most span-only runs, when it holds more than its
        share of the table and ``tenant`` holds less than its own; else ``tenant``'s own
        stalest. O(1) for a tenant over its share (a flood's case); a tenant within its share
        looks at the tenants that have span-only runs (usually few).
        """
        held = self.by_tenant.get(tenant)
        tenants = len(self.by_tenant) + (held is None)
        share = self.max_runs / tenants
        if held is None or len(held) < share:
            donor = max(self.idle, key=lambda t: len(self.idle[t]), default=None)
            if donor is not None and donor != tenant and len(self.by_tenant[donor]) > share:
                return next(iter(self.idle[donor].values()))
        lru = self.idle.get(tenant)
        return next(iter(lru.values())) if lru else None

    def touch(self, runs: Iterable[RunState]) -> None:
        """``runs`` were just heard from (their ``touched_at`` set to now): each span-only one
        becomes its tenant's most recent. O(1) per run; other runs are skipped."""
        span_only, idle = self.span_only, self.idle
        for run in runs:
            rid = run.run_id
            if span_only.get(rid) is run:
                lru = idle.get(run.tenant)
                if lru is not None and rid in lru:
                    lru.move_to_end(rid)

    def stale_span_only(self, now: float, age_s: float) -> list[RunState]:
        """The span-only runs not heard from for ``age_s`` or more, walked from the head of
        each tenant's LRU and stopping at its first fresh run: the work is the tenants plus
        the stale runs, not every tracked run (``touched_at`` only grows in LRU order)."""
        out: list[RunState] = []
        for lru in self.idle.values():
            for run in lru.values():
                if now - run.touched_at < age_s:
                    break
                out.append(run)
        return out

    def _idle_add(self, run: RunState) -> None:
        lru = self.idle.get(run.tenant)
        if lru is None:
            lru = self.idle[run.tenant] = OrderedDict()
        lru[run.run_id] = run

    def _idle_drop(self, run: RunState) -> None:
        lru = self.idle.get(run.tenant)
        if lru is not None and lru.pop(run.run_id, None) is not None and not lru:
            del self.idle[run.tenant]

    def live(self, run_id: str, principal: Principal | None = None) -> RunState:
        """The live run ``run_id``; another tenant's run (for ``principal``) is answered
        exactly like an unknown one (``UnknownRun``)."""
        run = self.runs.get(run_id)
        if run is None or (
            principal is not None
            and principal.tenant is not None
            and run.tenant != principal.tenant
        ):
            raise UnknownRun(f"run {run_id[:64]!r} is not live on this guard")
        return run

    # -- in and out -----------------------------------------------------------------------
    def add(self, run: RunState, *, span_only: bool) -> None:
        """Index a new run (the first run of a trace owns its foreign spans)."""
        rid = run.run_id
        self.runs[rid] = run
        self.by_tenant.setdefault(run.tenant, OrderedSet()).add(rid)
        trace = run.trace_id
        if trace and trace not in self.by_trace:
            self.by_trace[trace] = run
        if span_only:
            self.span_only[rid] = run
            self._idle_add(run)

    def forget(self, run: RunState) -> None:
        """Drop a run from every index, and the spans it held if it was provisional."""
        rid = run.run_id
        if run.provisional:
            self.provisional_spans -= len(run.seq_gate)  # type: ignore[arg-type]
            run.seq_gate = None
        self.runs.pop(rid, None)
        self.detached.pop(rid, None)
        if self.span_only.pop(rid, None) is not None:
            self._idle_drop(run)
        self._untenant(run)
        if run.trace_id and self.by_trace.get(run.trace_id) is run:
            del self.by_trace[run.trace_id]

    def set_tenant(self, run: RunState, tenant: str) -> None:
        """A provisional run learns its tenant from a later span."""
        self._untenant(run)
        span_only = self.span_only.get(run.run_id) is run
        if span_only:
            self._idle_drop(run)  # indexed by the tenant it had
        run.tenant = tenant
        self.by_tenant.setdefault(tenant, OrderedSet()).add(run.run_id)
        if span_only:
            self._idle_add(run)

    def _untenant(self, run: RunState) -> None:
        ids = self.by_tenant.get(run.tenant)
        if ids is not None:
            ids.discard(run.run_id)
            if not ids:
                del self.by_tenant[run.tenant]

    def attached(self, run: RunState) -> None:
        """Its agent's stream holds it now: neither detached nor span-only."""
        self.detached.pop(run.run_id, None)
        if self.span_only.pop(run.run_id, None) is not None:
            self._idle_drop(run)

    def remote(self, run: RunState) -> None:
        """Another replica holds its stream now: tracked like a span-only run here (no
        grace, no agent_lost; forgotten when it ends there or idles)."""
        self.detached.pop(run.run_id, None)
        if self.span_only.get(run.run_id) is not run:
            self.span_only[run.run_id] = run
            self._idle_add(run)  # the most recent of its tenant's: it was live until now

    def detach(self, run: RunState, now: float) -> None:
        """Its agent's stream dropped at ``now`` (monotonic): the grace period starts."""
        run.detached_at = now
        self.detached[run.run_id] = run

    # -- ended ids ------------------------------------------------------------------------
    def remember_ended(self, run_id: str) -> None:
        self.ended[run_id] = None
        if len(self.ended) > ENDED_MEMORY:
            self.ended.popitem(last=False)

    # -- provisional runs -------------------------------------------------------------------
    def hold(self, gate: list[Any], o: Observation) -> bool:
        """Keep a span for a provisional run's registration; False when the caps are hit."""
        if len(gate) < PROVISIONAL_SPANS_MAX and self.provisional_spans < PROVISIONAL_SPANS_TOTAL:
            gate.append(o)
            self.provisional_spans += 1
            return True
        return False

    def tenant_runs(self, tenant: str) -> list[RunState]:
        """The live runs of ``tenant``."""
        runs = self.runs
        return [runs[i] for i in self.by_tenant.get(tenant, ()) if i in runs]
