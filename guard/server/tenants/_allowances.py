"""Tenant allowances on the guard: grant, push, attribute spend, release.

The accounting is the policy's :class:`~guard.policy.TenantAllowances` (one per tenant with a
``cost_usd`` or ``tokens`` window); this module only wires it to the registry:

* **grant + push**: every live *root* run gets a chunk with its Admit (pushed just before it,
  so the run has its ceilings when it starts), again when it re-registers (the grant it holds),
  and more in answer to an ``AllowanceRequest``; the guard renews the live runs' grants every
  half ``allowance_ttl_s`` (the SDK falls back to its local limits after a ttl without one);
* **spend**: after each OTLP request, the cumulative usage of each touched root run (its
  budget counts its sub-agents too) moves from its grant into the windows;
* **late spans**: spans of a run that already ended still count towards its tenant's windows
  (a bounded map of recently ended run ids -> tenant), and consume the run's *tail* (what
  its final RunEnded usage says is still on the way);
* **release**: every way a run ends gives its outstanding grant back.

An ``AllowanceRequest`` naming a run that is not live on this stream (unknown, ended, or
another tenant's: answered alike) gets ``ttl_s=0``: the SDK falls back to its local limits
(fail-open, or refuses under ``fail_closed``). Runs on the registry's event loop.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from guard.errors import InvalidInput
from guard.policy import AllowanceGrant, TenantAllowances, Usage
from guard.server.decode._schema import (
    CACHED,
    COST,
    IN,
    KIND,
    KIND_MODEL,
    KIND_STEP,
    KIND_TOOL,
    MODEL,
    OUT,
    RUN_ID,
)
from guard.server.runtime._ordered import OrderedSet
from guard.wire import allowance_to_pb

if TYPE_CHECKING:  # pragma: no cover
    from guard.server.control._fanout import AgentSession
    from guard.server.runs._state import RunState
    from guard.server.runtime._auth import Principal
    from guard.server.tenants._interface import TenantsHost
    from guard.server.tenants._local import Tenants
    from guard.v1 import guard_pb2 as pb

__all__ = ["RECENT_ENDED", "Allowances", "root_of", "seen_of", "spend_of"]

RECENT_ENDED = 20_000  # ended run ids remembered (-> tenant, root) so late spans still count
_TAIL_S = 5.0  # how long a run's tail (final usage not seen yet) stays held after it ended
_MAX_TOKENS = float(2**53)  # a request beyond this is not a reservation, it is an attack
_MAX_COST_USD = 1e9
_UNSEEN: Any = object()  # a tenant whose ledger was not looked up yet


def root_of(run: RunState) -> RunState:
    """The root of ``run``'s tree (its budget counts its sub-agents' spend too)."""
    while run.parent is not None:
        run = run.parent
    return run


def seen_of(run: RunState) -> tuple[float, float]:
    """What ``run`` spent (cost_usd, tokens), as its grant counts it."""
    cost, tokens = run.budget.held()  # the guard never reserves: held = used
    return (cost, float(tokens))


class Allowances:
    """The allowance desk of :class:`~guard.server.tenants._local.LocalTenantBudgets`."""

    def __init__(self, registry: TenantsHost, tenants: Tenants) -> None:
        self.registry = registry
        self.tenants = tenants  # the windows the grants come out of (Tenants)
        settings = registry.config.guard
        self.ttl_s = float(settings.allowance_ttl_s)
        self._ledgers: dict[str, TenantAllowances | None] = {}
        self._recent: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._renewed_at = registry.clock()
        # runs whose spend the grants do not reflect yet
        self._dirty: OrderedSet[RunState] = OrderedSet()
        for k in ("allowance_grants", "allowance_exhausted", "allowance_unknown", "late_counted"):
            registry.stats.setdefault(k, 0)

    # -- the ledger of a tenant --------------------------------------------------------------
    def ledger(self, tenant: str) -> TenantAllowances | None:
        """The tenant's allowances, or ``None`` when it has no cost_usd / tokens window."""
        try:
            return self._ledgers[tenant]
        except KeyError:
            pass
        budget = self.tenants.budget(tenant)
        led = None
        if budget is not None:
            led = TenantAllowances(budget, tail_s=_TAIL_S)
            if not led.tracked():
                led = None
        if budget is not None:  # unknown tenants beyond the cap are not remembered either
            self._ledgers[tenant] = led
        return led

    def push(
        self, session: AgentSession | None, grant: AllowanceGrant, request_id: int = 0
    ) -> None:
        if session is None or session.closed:
            return
        msg, body = session.compose("allowance")
        allowance_to_pb(grant, request_id=request_id, ttl_s=self.ttl_s, into=body)
        session.post(msg)

    # -- hooks ---------------------------------------------------------------------------------
    def on_admit(self, run: RunState, session: AgentSession) -> None:
        """Before an Admit goes out: a new root run gets its first chunk, a re-registered one
        the grant it holds (ceilings are cumulative, so a repeat is harmless)."""
        if run.parent is not None or run.stop_reason is not None:
            return
        led = self._ledgers.get(run.tenant, _UNSEEN)
        if led is _UNSEEN:
            led = self.ledger(run.tenant)
        if led is None:
            return
        grant = led.grant_of(run.run_id)
        if grant is None:
            if self._dirty:
                self.refresh()
            grant = led.grant(run.run_id, self.registry.clock(), seen=seen_of(run))
            self.registry.stats["allowance_grants"] += 1
        self.push(session, grant)

    def checked(
        self, session: AgentSession, req: pb.AllowanceRequest, principal: Principal
    ) -> RunState | None:
        """Validate an ``AllowanceRequest`` and answer the ones that need no grant (a run
        not live on this stream: ``ttl_s=0``; a tenant without windows: no ceilings). The
        root run to grant to, else ``None`` (answered). ``InvalidInput`` if out of bounds."""
        need_cost, need_tokens = req.cost_usd, float(req.tokens)
        if not (math.isfinite(need_cost) and 0.0 <= need_cost <= _MAX_COST_USD):
            raise InvalidInput(f"allowance_request.cost_usd must be in [0, 1e9], got {need_cost}")
        if need_tokens > _MAX_TOKENS:
            raise InvalidInput(f"allowance_request.tokens {req.tokens} is out of range")
        run = self.registry.runs.get(req.run_id)
        if (
            run is None
            or run.session is not session
            or (principal.tenant is not None and run.tenant != principal.tenant)
        ):
            self.registry.stats["allowance_unknown"] += 1
            unknown = AllowanceGrant(req.run_id[:256], None, None)
            session.send("allowance", allowance_to_pb(unknown, request_id=req.request_id))
            return None
        root = root_of(run)
        if self.ledger(root.tenant) is None:  # no window: nothing to ask for (no ceilings)
            self.push(session, AllowanceGrant(req.run_id, None, None), req.request_id)
            return None
        return root

    def request(self, session: AgentSession, req: pb.AllowanceRequest, principal: Principal):
        """An ``AllowanceRequest``: grant at least what it needs, or say exhausted."""
        root = self.checked(session, req, principal)
        if root is None:
            return
        led = self.ledger(root.tenant)
        assert led is not None  # checked() answered the tenants without one
        need_cost, need_tokens = req.cost_usd, float(req.tokens)
        now = self.registry.clock()
        self.refresh()
        led.observe(root.run_id, *seen_of(root))
        grant = led.grant(
            root.run_id, now, need_cost_usd=need_cost, need_tokens=need_tokens, seen=seen_of(root)
        )
        self.registry.stats["allowance_exhausted" if grant.exhausted else "allowance_grants"] += 1
        self.push(session, grant, req.request_id)

    def observe(self, touched: Any) -> None:
        """After an OTLP request: the touched runs' spend will move from their grants into
        the windows. Only noted here (the ingest hot path); :meth:`refresh` applies it before
        anything reads the grants. Until then the outstanding grants are over-counted, which
        only ever grants less, never more."""
        if self._ledgers:
            self._dirty.update(touched)

    def refresh(self) -> None:
        """Apply the noted spend: each touched run's root (it carries its sub-agents' usage)
        moves what it spent from its grant into the windows, one lock per tenant."""
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, OrderedSet()
        ledgers = self._ledgers
        batches: dict[TenantAllowances, list[tuple[str, float, float]]] = {}
        for run in dirty:
            led = ledgers.get(run.tenant)
            if led is None:
                continue
            root = root_of(run)
            cost, tokens = seen_of(root)
            batches.setdefault(led, []).append((root.run_id, cost, tokens))
        for led, batch in batches.items():
            led.observe_many(batch)

    def release(self, run: RunState, outcome: Any = None) -> None:
        """The run ended (any way; called once per run): its grant goes back, but for the
        tail its final usage says is still on the way; late spans of it still count
        (``late_span``)."""
        tenant, run_id = run.tenant, run.run_id
        root = run if run.parent is None else root_of(run)
        if self.tenants.wants_usage(tenant):
            recent = self._recent
            if run_id in recent:
                recent.move_to_end(run_id)
            recent[run_id] = (tenant, root.run_id)
            if len(recent) > RECENT_ENDED:
                recent.popitem(last=False)
        led = self._ledgers.get(tenant)
        if led is None or root is not run:
            return
        # what it spent moves into the windows, then the rest goes back
        led.release(run_id, self.registry.clock(), final=spend_of(outcome), seen=seen_of(run))

    def late_span(self, o: Any, scope: str | None, spent: dict[str, Usage]) -> bool:
        """A span of a run that already ended: count it towards its tenant's windows (and
        the run's tail). Returns whether it counted (another tenant's run never does)."""
        entry = self._recent.get(o[RUN_ID])
        if entry is None:
            return False
        tenant, root_id = entry
        if scope is not None and tenant != scope:
            return False
        usage = spent.get(tenant)
        if usage is None:
            usage = spent[tenant] = Usage()
        kind = o[KIND]
        cost = 0.0
        tokens = 0
        if kind == KIND_MODEL:
            inp, out, c = o[IN], o[OUT], o[COST]
            if c is None and o[MODEL]:
                c = self.registry.config.prices.cost_usd(
                    o[MODEL], input_tokens=inp, output_tokens=out, cached_tokens=o[CACHED]
                )
            usage.model_calls += 1
            usage.input_tokens += inp
            usage.output_tokens += out
            tokens = inp + out
            if c is not None and math.isfinite(c) and c >= 0:
                cost = c
                usage.cost_usd = (usage.cost_usd or 0.0) + c
        elif kind == KIND_TOOL:
            usage.tool_calls += 1
            usage.tool_attempts += 1
        elif kind == KIND_STEP:
            usage.steps += 1
        self.registry.stats["late_counted"] += 1
        led = self._ledgers.get(tenant)
        if led is not None and (cost or tokens):
            led.spend_late(root_id, cost, float(tokens))
        return True

    def renew(self) -> None:
        """Sweep: apply noted spend, give back expired tails; every half ttl, push the live
        runs' grants again."""
        self.refresh()
        now = self.registry.clock()
        for led in self._ledgers.values():
            if led is not None:
                led.expire(now)
        if now - self._renewed_at < self.ttl_s / 2:
            return
        self._renewed_at = now
        for run in list(self.registry.runs.values()):
            if run.parent is None and run.connected:
                led = self._ledgers.get(run.tenant)
                grant = None if led is None else led.grant_of(run.run_id)
                if grant is not None:
                    self.push(run.session, grant)


def spend_of(usage: Any) -> tuple[float, float] | None:
    """(cost_usd, tokens) an ``Outcome`` or a ``Usage`` says a run spent (None: it does
    not say, or not in finite numbers)."""
    if usage is None:
        return None
    cost = usage.cost_usd or 0.0
    tokens = float(usage.input_tokens + usage.output_tokens)
    return (cost, tokens) if math.isfinite(cost) and cost >= 0 else None
