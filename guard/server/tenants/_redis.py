"""Tenant budgets of one replica of several: the fleet's windows and slots in Redis.

:class:`SharedTenantBudgets` is the ``TenantBudgets`` seam (``guard/server/tenants/_interface.py``) over
:class:`~guard.server._redis.RedisTenantBudgets`, with this replica's
:class:`~guard.server.tenants._local.LocalTenantBudgets` as its local view:

* **usage**: :meth:`record` (once per Export request per tenant) applies the delta to the
  local windows (the decision the span path acts on at once) and queues it; :meth:`sync`
  sends every queued tenant's delta, the queued admissions and the freed slots in **one
  pipeline** (one round trip per Export request), keeps the fleet's window sums the script
  returns as the view (``status``/``exhausted``), and on a window the fleet reached calls the
  registry's ``tenant_cut``: every live run of that tenant on this replica stops (the other
  replicas cut theirs at their own next request of that tenant);
* **slots** are the fleet's and exact: :meth:`admit` answers a new run only from ``sync``,
  with the script's verdict (``max_concurrent_runs`` across replicas); a re-registered run
  keeps the slot it holds. A background task renews this replica's live runs' slots every
  third of ``guard.slot_lease_s`` (one pipeline); a slot not renewed for a lease (a dead
  replica) is free again. Every way out frees it (:meth:`release` of an admitted run);
* **allowances** (grants to live runs) come out of the fleet's windows
  (:class:`~guard.server.tenants._redis_grants.FleetDesk`): a root run's grant goes in the
  admission's pipeline and reaches the agent before its Admit, AllowanceRequests and the
  runs' spend go in the next pipeline, so the overshoot bound holds across replicas: a
  tenant's spend passes a window's limit only by usage no grant covered (an estimate that was
  too low, a run that did not ask).

**Redis unreachable** (fail-open, or ``guard.fail_closed``) and **a blip is not an outage**
(admissions and asks wait up to ``HOLD_S`` for Redis): the outage half of this class,
:class:`~guard.server.tenants._redis_outage.FailOpen`.

**Redis restarted empty** (no persistence) loses: the windows' history (they restart from
what the replicas reconcile: from zero at worst); the outstanding grants (runs keep their
ceilings for ``allowance_ttl_s``, but Redis counts a grant again only when the run's next
grant re-creates its entry, so up to one grant per live run can be granted twice; so are
grants the local desk handed out during an outage); and the slots until the next heartbeat
(``slot_lease_s / 3``) re-claims them (a tenant at its cap may admit that many too many).
Nothing of a run's own limits or its termination record is in Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from guard.errors import StateUnavailable
from guard.policy import Decision, Usage
from guard.server.tenants._interface import Spent, Verdict
from guard.server.tenants._local import AllowanceHooks, LocalTenantBudgets
from guard.server.tenants._redis_budgets import RecordBatch, RedisTenantBudgets
from guard.server.tenants._redis_grants import FleetDesk
from guard.server.tenants._redis_outage import HOLD_S, FailOpen
from guard.server.tenants._redis_pending import PendingUsage
from guard.wire import tenant_budget_to_pb

if TYPE_CHECKING:  # pragma: no cover
    from guard.policy import TenantBudget
    from guard.server._redis._client import Call, StateClient
    from guard.server.decode._schema import Observation
    from guard.server.runs._state import RunState
    from guard.server.tenants._interface import TenantsHost
    from guard.v1 import guard_pb2 as pb

__all__ = ["HOLD_S", "SharedTenantBudgets"]

log = logging.getLogger("guard.server")
_TICK_S = 0.5  # the background task settles queued work (ends from the sweep) this often
_DOWN_TICK_S = 0.1  # and this often while Redis is down (the client fails fast meanwhile)
_STATS = ("fail_open_periods", "fail_open_admits", "fail_closed_denials", "reconciled_tenants")


class SharedTenantBudgets(AllowanceHooks, FailOpen):
    """``TenantBudgets`` of a replica (``serve --redis``); see the module docstring."""

    settles = True  # sync() is where the fleet's verdicts come from

    def __init__(self, registry: TenantsHost, state: StateClient) -> None:
        cfg = registry.config.guard
        self.registry = registry
        self.local = LocalTenantBudgets(registry)
        self.remote = RedisTenantBudgets(
            state,
            registry.config.tenant_limits,
            lease_s=float(cfg.slot_lease_s),
        )
        self.fail_closed = bool(cfg.fail_closed)
        self.pending = PendingUsage()
        self.down = False  # Redis did not answer the last call (fail-open until it does)
        self.down_since = 0.0  # when the outage began (monotonic)
        self.allowances: FleetDesk = FleetDesk(self)  # grants out of the fleet's windows
        self._usage: dict[str, Usage] = {}  # queued deltas, one per tenant
        self._admits: list[tuple[str, str, Verdict, Any]] = []
        self._ends: dict[str, Call] = {}  # run id -> the call freeing its slot and grant
        self._kept: set[str] = set()  # admissions being resolved that found the slot held
        self._view: dict[str, list[float]] = {}  # the fleet's window sums, as of last sync
        self._task: asyncio.Task[None] | None = None
        for k in _STATS:
            registry.stats.setdefault(f"redis_{k}", 0)

    # -- answered at once by the local view (the registry never awaits) -------------------
    def wants_usage(self, tenant: str) -> bool:
        return self.local.wants_usage(tenant)

    def budget(self, tenant: str) -> TenantBudget | None:
        return self.local.budget(tenant)

    def known(self) -> list[str]:
        return self.local.known()

    def late_span(self, o: Observation, scope: str | None, spent: dict[str, Usage]) -> bool:
        return self.local.late_span(o, scope, spent)

    def restore(self, tenant: str, usage: Usage) -> None:
        self.local.record(tenant, usage)  # the fleet counted it already (where the run was)

    # -- runs ------------------------------------------------------------------------------
    def admit(self, tenant: str, run_id: str, then: Verdict, *, grant: Spent = None) -> None:
        """The local view first (this replica's own slots and windows are a part of the
        fleet's: a local refusal is final); then the fleet's verdict, from :meth:`sync`
        (with the run's first grant when ``grant``)."""
        verdict = self.local.tenants.admit(tenant)
        if verdict.stop:
            then(verdict)
        elif self.fail_closed and not self.remote.healthy:
            then(self._closed_denial(tenant))
        else:
            if grant is not None and not self.allowances.tracked(tenant):
                grant = None
            self._admits.append((tenant, run_id, then, grant))

    def run_ended(self, tenant: str, run_id: str = "") -> None:
        self.local.tenants.run_ended(tenant)
        if run_id:  # a registration that did not make a run: its slot and first grant
            self.allowances.held.pop(run_id, None)
            if run_id in self._kept:
                return  # the slot was held before it (the run lives on elsewhere): not ours
            self._ends[run_id] = self.remote.release_call(tenant, run_id, free_slot=True)

    def release(self, run: RunState, outcome: Any = None) -> None:
        self.local.release(run, outcome)
        call = self.allowances.release(run, outcome)  # _finish: every way out, once per run
        if call is not None:
            self._ends[run.run_id] = call

    def forget_limits(self) -> None:
        """Policy reload: read every tenant's limits again."""
        self.remote.forget_limits()
        self._view.clear()

    # -- usage -----------------------------------------------------------------------------
    def record(self, tenant: str, usage: Usage) -> Decision:
        decision = self.local.record(tenant, usage)
        if self.local.wants_usage(tenant):
            queued = self._usage.get(tenant)
            if queued is None:
                self._usage[tenant] = usage.copy()
            else:
                queued.add(usage)
        return decision

    def exhausted(self, tenant: str) -> tuple[str, float, float] | None:
        hit = self.local.exhausted(tenant)
        sums = self._view.get(tenant)
        budget = self.local.budget(tenant)
        if hit is not None or sums is None or budget is None:
            return hit
        for r, used in zip(budget.limits.rolling, sums, strict=False):
            if used >= r.limit - 1e-9 * max(1.0, r.limit):
                return (r.metric, used, r.limit)
        return None

    def status(self, tenant: str) -> pb.TenantBudget:
        """The local view with the fleet's window sums as of the last sync (``live_runs``:
        this replica's)."""
        msg = self.local.status(tenant)
        sums = self._view.get(tenant)
        if sums is not None and len(sums) == len(msg.windows):
            for w, used in zip(msg.windows, sums, strict=True):
                w.used = max(w.used, used)
            msg.exhausted = msg.exhausted or self.exhausted(tenant) is not None
        return msg

    async def fleet_status(self, tenant: str) -> pb.TenantBudget:
        if self.local.budget(tenant) is None:  # beyond the tracked-tenants cap
            return self.local.status(tenant)
        try:
            st = await self.remote.status(tenant)
        except StateUnavailable as exc:
            self._unreachable(exc)
            return self.status(tenant)
        self._view[tenant] = [w[2] for w in st.windows]
        return tenant_budget_to_pb(
            tenant,
            live_runs=st.live_runs,
            max_concurrent_runs=st.max_concurrent_runs,
            windows=st.windows,
            exhausted=st.exhausted is not None,
        )

    # -- settling with Redis ---------------------------------------------------------------
    async def sync(self) -> None:
        """Send what is queued (ended runs, admissions, every tenant's usage and its runs'
        spend, allowance asks) in one pipeline and apply the replies; on an outage, fall
        back (``FailOpen``)."""
        fleet = self.allowances
        if not (self._usage or self._admits or self._ends or fleet.busy):
            return
        usage, self._usage = self._usage, {}
        admits, self._admits = self._admits, []
        ends, self._ends = self._ends, {}
        observed, asks = fleet.take()
        r = self.remote
        tenants = list(usage.keys() | observed.keys())
        calls = list(ends.values())
        for t, rid, _then, grant in admits:
            calls.append(r.admit_call(t, rid))
            if grant is not None:
                calls.append(fleet.admission_call(t, rid, grant))
        for t in tenants:
            seen = observed.get(t, {})
            calls.append(
                r.record_call(t, RecordBatch(usage.get(t), [(k, *v) for k, v in seen.items()]))
            )
        calls.extend(fleet.ask_calls(asks))
        started = time.perf_counter()
        try:
            replies = iter(await r.client.call_many(calls))
        except StateUnavailable as exc:
            self._unreachable(exc)
            for t, u in usage.items():
                self.pending.add(t, u)
            if not self.local_answers:
                # A blip (``FailOpen``): admissions, asks and ends wait for the next sync.
                # Retrying is safe: an admit of a run holding its slot keeps it, a repeated
                # grant only grants more.
                self._admits[:0] = admits
                for rid, call in ends.items():
                    self._ends.setdefault(rid, call)
                fleet.hold(asks)
                return
            for t, _rid, then, _grant in admits:
                self._fail_open_admit(t, then)
            fleet.unanswered(asks)
            return  # the freed slots and grants lapse with their lease
        telemetry = self._telemetry()
        if telemetry is not None:
            telemetry.round_trip(time.perf_counter() - started, "sync")
        for _ in ends:
            next(replies)
        for t, rid, then, grant in admits:
            reply = next(replies)
            verdict = r.admit_reply(t, reply)
            if grant is not None:
                undo = fleet.admitted(t, rid, not verdict.stop, next(replies))
                if undo is not None:
                    self._ends[rid] = undo
            if verdict.stop:
                self.local.tenants.run_ended(t)  # the local slot taken in admit()
            if r.admit_kept(reply):
                self._kept.add(rid)
            self._resolve(then, verdict)
            self._kept.discard(rid)
        for t in tenants:
            decision, self._view[t] = r.record_reply(t, next(replies))
            if decision.stop:
                self.registry.tenant_cut(t, decision)
        for ask in asks:
            fleet.answered(ask, next(replies))
        if self.down:
            await self._recovered()

    # -- background ------------------------------------------------------------------------
    async def start(self) -> None:
        self._task = asyncio.ensure_future(self._beat())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            await asyncio.wait_for(self.sync(), 1.0)  # what the drain ended
        except Exception:
            log.warning("tenant budgets: last sync with redis failed", exc_info=True)
        await self.remote.client.aclose()

    async def _beat(self) -> None:
        """Settle queued work every tick; renew (claim) the live runs' slots every third of
        the lease; while Redis is down, probe it so the outage ends when it answers."""
        every = self.remote.lease_s / 3
        last = time.monotonic()
        while True:
            # while Redis is down, often: what a blip held is retried soon after it answers
            await asyncio.sleep(_DOWN_TICK_S if self.down else min(_TICK_S, every))
            try:
                await self.sync()
                if time.monotonic() - last >= every or self.down:
                    live = self._live()
                    if live:
                        await self.remote.heartbeat(live, claim=True)
                    elif self.down:
                        await self.remote.client.ping()
                        if not self.remote.healthy:
                            continue
                    last = time.monotonic()
                    if self.down:
                        await self._recovered()
            except StateUnavailable as exc:
                self._unreachable(exc)
            except Exception:
                log.exception("tenant budgets: background sync failed")
