"""The allowance desk of a replica: tenant grants out of the fleet's windows in Redis.

The same messages as the in-memory desk (:class:`~guard.server.tenants._allowances.Allowances`,
which this desk uses for validation, pushing and late spans, and which answers alone while
Redis is unreachable), but every grant comes from the ``grant`` operation of the tenant's
script, so used + outstanding grants never pass a window's limit *across replicas*: as on a
single guard, a tenant's spend passes a window's limit only by usage no grant covered (an
estimate that was too low, a run that did not ask), by exactly that excess:

* a root run's grant goes out in the same pipeline as its admission and is pushed just
  before its Admit (a new run's first chunk; a re-registered run's entry, or a new one from
  its snapshot's spend); a run re-attaching on this replica gets the grant it was pushed;
* an ``AllowanceRequest`` is a ``grant`` call sent by the next ``sync`` (after the request's
  spend went into the windows, in the same pipeline), answered when Redis replies;
* the touched root runs' cumulative spend moves from their grants into the windows in the
  tenant's ``record`` call; a run's end gives its grant back (but for the tail its final
  usage announces) and frees its slot, in one ``end`` call;
* the grants of live runs are renewed by the slot heartbeat (their lease) and pushed again
  every half ``allowance_ttl_s``.

Queued work is sent by :class:`~guard.server._redis.SharedTenantBudgets.sync`; this class
only builds the calls and applies the replies.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from guard.server.runtime._ordered import OrderedSet
from guard.server.tenants._allowances import root_of, seen_of, spend_of

if TYPE_CHECKING:  # pragma: no cover
    from guard.policy import AllowanceGrant
    from guard.server._redis._client import Call
    from guard.server.control._fanout import AgentSession
    from guard.server.runs._state import RunState
    from guard.server.runtime._auth import Principal
    from guard.v1 import guard_pb2 as pb

__all__ = ["FleetDesk"]


class FleetDesk:
    """Grants of one replica's runs out of the fleet's windows (see the module docstring)."""

    def __init__(self, shared: Any) -> None:
        self.shared = shared  # the SharedTenantBudgets (its remote, its outage state)
        self.desk = shared.local.allowances  # the in-memory desk: checks, pushes, fallback
        self.held: dict[str, AllowanceGrant] = {}  # root run id -> its latest grant
        self.observed: dict[str, dict[str, tuple[float, float]]] = {}  # tenant -> root -> seen
        # (tenant, root id, need_cost, need_tokens, seen, session, request_id, req, principal)
        self._asks: list[tuple[Any, ...]] = []
        # runs whose spend Redis's grants do not have yet
        self._dirty: OrderedSet[RunState] = OrderedSet()
        self._renewed_at = shared.registry.clock()

    @property
    def busy(self) -> bool:
        """Whether anything waits for the next pipeline."""
        return bool(self.observed or self._asks or self._dirty)

    def tracked(self, tenant: str) -> bool:
        """Whether ``tenant`` has a cost_usd or tokens window (grants to hand out)."""
        return self.desk.ledger(tenant) is not None

    # -- the seam's hooks ----------------------------------------------------------------
    def on_admit(self, run: RunState, session: AgentSession) -> None:
        if run.parent is not None or run.stop_reason is not None or not self.tracked(run.tenant):
            return
        grant = self.held.get(run.run_id)
        if grant is not None:
            self.desk.push(session, grant)
        elif self.shared.local_answers:
            self.desk.on_admit(run, session)  # out of this replica's windows meanwhile
        else:  # re-registered (failover): the grant it holds in Redis, after its Admit
            self._asks.append((run.tenant, run.run_id, 0.0, 0.0, seen_of(run), session, 0))

    def request(self, session: AgentSession, req: pb.AllowanceRequest, principal: Principal):
        if self.shared.local_answers:
            self.desk.request(session, req, principal)
            return
        root = self.desk.checked(session, req, principal)
        if root is None:
            return
        seen = seen_of(root)  # its spend goes first (take() notes the others' too)
        self.observed.setdefault(root.tenant, {})[root.run_id] = seen
        need = (req.cost_usd, float(req.tokens))
        ask = (root.tenant, root.run_id, *need, seen, session, req.request_id, req, principal)
        self._asks.append(ask)

    def observe(self, touched: Any) -> None:
        """Only noted (the span path): the touched runs' spend moves from their grants into
        the windows in the next pipeline, the one that records that spend."""
        if self.shared.down:
            self.desk.observe(touched)  # the in-memory desk grants meanwhile
        self._dirty.update(touched)

    def _note(self) -> None:
        observed = self.observed
        dirty, self._dirty = self._dirty, OrderedSet()
        for run in dirty:
            root = root_of(run)
            if self.tracked(root.tenant):
                observed.setdefault(root.tenant, {})[root.run_id] = seen_of(root)

    def release(self, run: RunState, outcome: Any) -> Call | None:
        """The run ended (once per way out; ``outcome``: the agent's RunEnded, whose final
        usage keeps the tail held): the ``end`` call that gives its grant back and frees its
        slot (``None``: nothing in Redis to change)."""
        final = None if outcome is None else spend_of(outcome)
        if run.remote is not None:
            # Another replica holds its stream (its agent failed over there, or its spans come
            # here by trace-ID routing): the slot and the grant in Redis are that replica's,
            # under the same run id. However this replica ends or forgets it, it frees nothing.
            self.held.pop(run.run_id, None)
            return None
        remote = self.shared.remote
        if run.parent is None and self.tracked(run.tenant):
            self.held.pop(run.run_id, None)
            return remote.release_call(
                run.tenant, run.run_id, final, seen_of(run), free_slot=run.admitted
            )
        return remote.end_call(run.tenant, run.run_id) if run.admitted else None

    def renew(self) -> None:
        if self.shared.down:
            self.desk.renew()
            return
        now = self.shared.registry.clock()
        if now - self._renewed_at < self.desk.ttl_s / 2:
            return
        self._renewed_at = now
        runs = self.shared.registry.runs
        for run_id, grant in self.held.items():
            run = runs.get(run_id)
            if run is not None and run.connected:
                self.desk.push(run.session, grant)

    # -- the pipeline ----------------------------------------------------------------------
    def admission_call(self, tenant: str, run_id: str, seen: tuple[float, float]) -> Call:
        """A root run's grant (a new one's first, or what a re-registered one holds and
        more), right after its admission in one pipeline."""
        return self.shared.remote.grant_call(tenant, run_id, seen=seen)

    def admitted(self, tenant: str, run_id: str, ok: bool, reply: Sequence[str]) -> Call | None:
        """The reply of an admission's grant: kept for its Admit, or (denied) the call that
        gives the entry back."""
        remote = self.shared.remote
        if not ok:
            return remote.release_call(tenant, run_id)
        self.held[run_id] = remote.grant_reply(tenant, run_id, reply)
        self.shared.registry.stats["allowance_grants"] += 1
        return None

    def take(self) -> tuple[dict[str, dict[str, tuple[float, float]]], list]:
        """What the next pipeline carries: the touched runs' spend (always in the pipeline
        that records the same spend into the windows: a spend in the windows that the grants
        do not show yet is counted twice, and refuses runs while money is left), the asks."""
        if self._dirty:
            self._note()
        observed, self.observed = self.observed, {}
        asks, self._asks = self._asks, []
        return observed, asks

    def ask_calls(self, asks: list[tuple[Any, ...]]) -> Iterator[Call]:
        remote = self.shared.remote
        for tenant, rid, need_cost, need_tokens, seen, *_ in asks:
            yield remote.grant_call(tenant, rid, (need_cost, need_tokens), seen)

    def answered(self, ask: tuple[Any, ...], reply: Sequence[str]) -> None:
        tenant, rid, _c, _t, _s, session, request_id = ask[:7]
        grant = self.shared.remote.grant_reply(tenant, rid, reply)
        if rid in self.shared.registry.runs:  # it may have ended while Redis answered
            self.held[rid] = grant
        stat = "allowance_exhausted" if grant.exhausted else "allowance_grants"
        self.shared.registry.stats[stat] += 1
        self.desk.push(session, grant, request_id)

    def hold(self, asks: list[tuple[Any, ...]]) -> None:
        """Redis did not answer, but only just (a blip): the asks go with the next sync."""
        self._asks[:0] = asks

    def unanswered(self, asks: list[tuple[Any, ...]]) -> None:
        """Redis did not answer: the in-memory desk answers (this replica's windows)."""
        for ask in asks:
            if len(ask) > 7:  # an AllowanceRequest
                req, principal = ask[7], ask[8]
                self.desk.request(ask[5], req, principal)
            else:  # the grant of a re-registered run
                run = self.shared.registry.runs.get(ask[1])
                if run is not None and run.session is ask[5]:
                    self.desk.on_admit(run, ask[5])
