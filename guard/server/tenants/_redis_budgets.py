"""Tenant budgets shared by the replicas through Redis.

The same operations, decisions and messages as the in-memory ``guard.policy.TenantBudget``
(rolling windows, concurrency cap) and ``guard.policy.TenantAllowances`` (grants), atomic
across processes: each operation of a tenant is one call of one Lua script
(:mod:`guard.server.tenants._redis_lua`), and a whole Export request's usage of a tenant (its window
deltas, the touched runs' cumulative spend, its ended runs' late spend) is one call, so one
round trip per request and tenant, and :meth:`RedisTenantBudgets.record_many` sends the calls
of all the request's tenants in one pipeline.

**Time.** Redis's own clock (``TIME`` inside the script) by default, so every replica cuts
the same buckets whatever its own clock says. ``clock=`` supplies the time instead (tests
with a virtual clock); one deployment must use one or the other, never both.

**Keys** (``P`` = ``prefix``, ``T`` = the tenant, percent-encoded, in a hash tag ``{T}``):

=======================  ======  ==========================================================
``P:{T}:w:<metric>:<s>``  hash   one per rolling limit: ``h`` newest bucket, ``s`` running
                                 sum, one field per non-empty bucket; TTL window_s + 1 s
``P:{T}:slots``          zset    run -> lease expiry: concurrency slots; a lease not renewed
                                 by :meth:`heartbeat` within ``lease_s`` frees the slot
``P:{T}:grants``         hash    run -> its grant (seen and ceiling per metric, live|tail)
``P:{T}:exp``            zset    run -> when its grant is given back (lease, or tail_s)
``P:{T}:agg``            hash    outstanding grants, live grant count, last needs
=======================  ======  ==========================================================

The four state keys get a TTL of ``max(windows, lease_s, tail_s) + 60 s`` at every write, so
an idle tenant leaves nothing behind. Memory (``benchmarks/bench_redis_windows.py``,
Redis 6.2): a tenant with 4 windows of 60 buckets, all full, about 2.5 KB; each live run
with a slot and a grant about 370 B (slots + grants + exp), so about 0.4 MB per 1,000. A window's buckets are keyed by metric and length,
not by limit, so replicas with different limits during a rollout share the counts, and a
changed limit keeps them (the in-memory ``set_limits`` starts such a window from zero).

**Redis restarted empty** (no persistence): the windows restart from zero, the slots and the
grants are gone. :meth:`reconcile` adds back what a replica counted locally meanwhile and
re-claims its live runs' slots; a run's next grant re-creates its entry from its ``seen``
usage. Server-side ``TenantBudget.reserve`` holds are not mirrored: the guard itself never
reserves (its runs hold grants, which are the TTL-bounded reservations here).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from guard.errors import InvalidInput
from guard.policy import (
    CONTINUE,
    AllowanceGrant,
    Decision,
    TenantLimits,
    Usage,
)
from guard.policy._allowance import short_of_grant
from guard.policy._rolling import concurrency_reached, nothing_to_grant, window_reached
from guard.server._redis._client import Call, StateClient

__all__ = ["RecordBatch", "RedisTenantBudgets", "TenantStatus"]

_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-@")
_METRICS = ("cost_usd", "tokens")
_MAX_SPECS = 10_000  # tenants whose keys and limits are cached


def _tag(tenant: str) -> str:
    """The tenant as a key part: injective, and without ``{}:`` (hash tags stay whole)."""
    return "".join(c if c in _SAFE else "".join(f"%{b:02X}" for b in c.encode()) for c in tenant)


def _finite(v: float) -> float:
    v = float(v)
    if not math.isfinite(v) or v < 0:
        raise InvalidInput(f"allowance amounts must be finite and >= 0, got {v!r}")
    return v


@dataclass(frozen=True, slots=True)
class TenantStatus:
    """What ``GuardAdmin.TenantBudgets`` shows of one tenant."""

    tenant: str
    live_runs: int
    max_concurrent_runs: int | None
    windows: list[tuple[str, float, float, float]]  # (metric, window_s, used, limit)
    exhausted: tuple[str, float, float] | None
    outstanding: tuple[float, float]  # granted but unspent (cost_usd, tokens)


@dataclass(slots=True)
class RecordBatch:
    """One Export request's part of one tenant: its window deltas, the cumulative usage of
    its touched root runs ``(run_id, cost_usd, tokens)``, and late spend of ended runs."""

    delta: Usage | None = None
    observe: Sequence[tuple[str, float, float]] = ()
    late: Sequence[tuple[str, float, float]] = ()
    runs: int = 0  # admissions counted elsewhere (reconcile after an outage)


class _Spec:
    """A tenant's keys and the fixed part of its script arguments."""

    __slots__ = ("args", "has", "keys", "limits")

    def __init__(self, prefix: str, tenant: str, limits: TenantLimits, tail: list[str]) -> None:
        base = f"{prefix}:{{{_tag(tenant)}}}:"
        self.limits = limits
        self.keys = [base + k for k in ("agg", "slots", "grants", "exp")]
        args = [str(len(limits.rolling))]
        for r in limits.rolling:
            self.keys.append(f"{base}w:{r.metric}:{float(r.window_s)!r}")
            args += [r.metric, repr(float(r.limit)), repr(float(r.window_s))]
        cap = limits.max_concurrent_runs
        longest = max((r.window_s for r in limits.rolling), default=0.0)
        self.args = [*args, tail[0], "" if cap is None else str(int(cap)), *tail[1:4]]
        self.args.append(str(int(1000 * (max(longest, float(tail[1]), float(tail[2])) + 60))))
        self.has = tuple(any(r.metric == m for r in limits.rolling) for m in _METRICS)


class RedisTenantBudgets:
    """Every tenant's rolling windows, concurrency slots and allowance grants, in Redis.

    All methods are coroutines and raise :class:`guard.errors.StateUnavailable` when Redis
    does not answer (fast: see :class:`StateClient`); the caller then uses its local state.
    """

    def __init__(
        self,
        client: StateClient,
        limits_of: Callable[[str], TenantLimits],
        *,
        tail_s: float = 5.0,
        lease_s: float = 30.0,
        buckets: int = 60,
        prefix: str = "og",
        clock: Callable[[], float] | None = None,
    ) -> None:
        if not (isinstance(buckets, int) and 1 <= buckets <= 1000):
            raise InvalidInput(f"buckets must be an int in [1, 1000], got {buckets!r}")
        self.client = client
        self.lease_s = float(lease_s)
        self._limits_of = limits_of
        self._clock = clock
        self._prefix = prefix
        self._tail = [str(buckets), repr(float(lease_s)), repr(float(tail_s))]
        self._specs: dict[str, _Spec] = {}

    @property
    def healthy(self) -> bool:
        return self.client.healthy

    def forget_limits(self) -> None:
        """Policy reload: read every tenant's limits again."""
        self._specs.clear()

    # -- plumbing ----------------------------------------------------------------------------
    def _spec(self, tenant: str) -> _Spec:
        s = self._specs.get(tenant)
        if s is None:
            if len(self._specs) >= _MAX_SPECS:  # tenant names come from the wire
                self._specs.clear()
            s = self._specs[tenant] = _Spec(
                self._prefix, tenant, self._limits_of(tenant), self._tail
            )
        return s

    def _call(self, tenant: str, op: str, *extra: str) -> Call:
        s = self._spec(tenant)
        now = "" if self._clock is None else repr(float(self._clock()))
        return (s.keys, [op, now, *s.args, *extra])

    async def _one(self, tenant: str, op: str, *extra: str) -> list[str]:
        keys, args = self._call(tenant, op, *extra)
        return await self.client.call(keys, args)

    def _window_decision(self, tenant: str, r: Sequence[str]) -> Decision:
        lim = self._spec(tenant).limits
        rl = lim.rolling[int(r[1]) - 1]
        return window_reached(tenant, rl.metric, float(r[2]), float(r[3]), rl.window_s)

    def _grant(self, tenant: str, run_id: str, r: Sequence[str]) -> AllowanceGrant:
        has = self._spec(tenant).has
        c = (float(r[1]) if has[0] else None, float(r[2]) if has[1] else None)
        if r[0] != "x":
            return AllowanceGrant(run_id, *c)
        i, need, available, limit, used, out = (float(x) for x in r[3:9])
        detail = short_of_grant(tenant, _METRICS[int(i) - 1], need, available, limit, used, out)
        return AllowanceGrant(run_id, *c, exhausted=True, detail=detail)

    # -- runs ----------------------------------------------------------------------------------
    def admit_call(self, tenant: str, run_id: str) -> Call:
        """The script call of :meth:`admit` (to go out in a caller's pipeline)."""
        return self._call(tenant, "admit", run_id)

    @staticmethod
    def admit_kept(r: Sequence[str]) -> bool:
        """Whether an ``admit`` reply says the run held its slot already (it is registered
        elsewhere too, e.g. on the replica its agent failed over to)."""
        return len(r) > 1 and r[0] == "ok" and r[1] == "kept"

    def admit_reply(self, tenant: str, r: Sequence[str]) -> Decision:
        """The decision an ``admit`` call's reply ``r`` means."""
        if r[0] == "ok":
            return CONTINUE
        if r[0] == "c":
            return concurrency_reached(tenant, int(float(r[1])), int(float(r[2])))
        if r[0] == "w":
            return self._window_decision(tenant, r)
        j, left, need, granted = int(r[1]), float(r[2]), float(r[3]), float(r[4])
        return nothing_to_grant(tenant, _METRICS[j - 1], left, need, granted)

    async def admit(self, tenant: str, run_id: str) -> Decision:
        """Take a concurrency slot and count the run in the ``runs`` windows, or deny it
        (STOP / tenant_budget, the in-memory messages). A run that holds a slot already (it
        re-registered on another replica) keeps it and is not counted again."""
        return self.admit_reply(tenant, await self.client.call(*self.admit_call(tenant, run_id)))

    def end_call(self, tenant: str, run_id: str) -> Call:
        """The script call of :meth:`run_ended`."""
        return self._call(tenant, "end", run_id, "1", "-")

    async def run_ended(self, tenant: str, run_id: str) -> None:
        """Free the run's slot (idempotent)."""
        await self.client.call(*self.end_call(tenant, run_id))

    async def heartbeat(self, runs: Mapping[str, Iterable[str]], *, claim: bool = False) -> None:
        """Renew the leases of this replica's live runs (slots and grants), one pipeline for
        every tenant. ``claim`` re-creates missing slots (after Redis came back empty)."""
        calls = []
        for tenant, ids in runs.items():
            ids = list(ids)
            if ids:
                calls.append(
                    self._call(tenant, "heartbeat", "1" if claim else "0", str(len(ids)), *ids)
                )
        if calls:
            await self.client.call_many(calls)

    # -- usage ---------------------------------------------------------------------------------
    def record_call(self, tenant: str, b: RecordBatch) -> Call:
        """The script call of one tenant's part of :meth:`record_many`."""
        d = b.delta or Usage()
        extra = [
            repr(float(d.cost_usd or 0.0)),
            str(d.tokens),
            str(d.input_tokens),
            str(d.output_tokens),
            str(d.steps),
            str(d.tool_calls),
            str(int(b.runs)),
            str(len(b.observe)),
        ]
        for rid, cost, tokens in b.observe:
            extra += [rid, repr(_finite(cost)), repr(_finite(tokens))]
        extra.append(str(len(b.late)))
        for rid, cost, tokens in b.late:
            extra += [rid, repr(_finite(cost)), repr(_finite(tokens))]
        return self._call(tenant, "record", *extra)

    async def record_many(self, batches: dict[str, RecordBatch]) -> dict[str, Decision]:
        """One Export request: every tenant's usage in one round trip. The decision per
        tenant is STOP / tenant_budget once any of its windows is reached."""
        tenants = list(batches)
        replies = await self.client.call_many([self.record_call(t, batches[t]) for t in tenants])
        return {t: self.record_reply(t, r)[0] for t, r in zip(tenants, replies, strict=True)}

    def record_reply(self, tenant: str, r: Sequence[str]) -> tuple[Decision, list[float]]:
        """A ``record`` call's reply: the decision, and every window's fleet-wide sum after
        it (in the order of the tenant's rolling limits)."""
        if r[0] == "ok":
            return CONTINUE, [float(x) for x in r[1:]]
        return self._window_decision(tenant, r), [float(x) for x in r[4:]]

    async def record(self, tenant: str, delta: Usage | None = None, **kw: Any) -> Decision:
        """:meth:`record_many` for one tenant (``observe=``, ``late=``, ``runs=``)."""
        return (await self.record_many({tenant: RecordBatch(delta, **kw)}))[tenant]

    async def reconcile(
        self, tenant: str, delta: Usage, *, runs: int = 0, live: Iterable[str] = ()
    ) -> Decision:
        """After an outage: add what this replica counted locally meanwhile (at the current
        time, so it stays in the windows a little longer than it would have: never less) and
        re-claim its live runs' slots."""
        d = await self.record(tenant, delta, runs=runs)
        await self.heartbeat({tenant: live}, claim=True)
        return d

    # -- grants --------------------------------------------------------------------------------
    async def grant(
        self,
        tenant: str,
        run_id: str,
        *,
        need_cost_usd: float = 0.0,
        need_tokens: float = 0.0,
        seen: tuple[float, float] = (0.0, 0.0),
    ) -> AllowanceGrant:
        """``TenantAllowances.grant`` across replicas (all or nothing; used + outstanding
        grants never exceed a limit). Renews the run's grant lease."""
        call = self.grant_call(tenant, run_id, (need_cost_usd, need_tokens), seen)
        return self.grant_reply(tenant, run_id, await self.client.call(*call))

    def grant_call(self, tenant: str, run_id: str, need=(0.0, 0.0), seen=(0.0, 0.0)) -> Call:
        """The script call of :meth:`grant` (``need``, ``seen``: cost_usd, tokens)."""
        vals = (*need, *seen)
        return self._call(tenant, "grant", run_id, *(repr(_finite(v)) for v in vals))

    def grant_reply(self, tenant: str, run_id: str, r: Sequence[str]) -> AllowanceGrant:
        """The grant a ``grant`` (or ``grant_of``) call's reply ``r`` means."""
        return self._grant(tenant, run_id, r)

    async def grant_of(self, tenant: str, run_id: str) -> AllowanceGrant | None:
        r = await self._one(tenant, "grant_of", run_id)
        return None if r[0] == "none" else self._grant(tenant, run_id, r)

    async def release(self, tenant: str, run_id: str, **kw: Any) -> None:
        """The run ended: its spend ``seen`` moves into the windows, the rest of its grant
        goes back but for the tail up to its ``final`` usage (held ``tail_s``); with
        ``free_slot`` its concurrency slot too, all in one call. Idempotent. (Keywords:
        those of :meth:`release_call`.)"""
        await self.client.call(*self.release_call(tenant, run_id, **kw))

    def release_call(
        self,
        tenant: str,
        run_id: str,
        final: tuple[float, float] | None = None,
        seen: tuple[float, float] | None = None,
        free_slot: bool = False,
    ) -> Call:
        """The script call of :meth:`release`."""
        s = ("", "") if seen is None else (repr(_finite(seen[0])), repr(_finite(seen[1])))
        f = (
            ("none",)
            if final is None
            else ("final", repr(_finite(final[0])), repr(_finite(final[1])))
        )
        return self._call(tenant, "end", run_id, "1" if free_slot else "0", f[0], *s, *f[1:])

    async def expire(self, tenant: str) -> None:
        """Give back the tails whose time is up and the grants whose lease lapsed (the runs
        of a replica that died)."""
        await self._one(tenant, "expire")

    # -- reading -------------------------------------------------------------------------------
    async def status(self, tenant: str) -> TenantStatus:
        r = await self._one(tenant, "status")
        lim = self._spec(tenant).limits
        n = len(lim.rolling)
        windows = [
            (rl.metric, rl.window_s, float(r[4 + i]), rl.limit) for i, rl in enumerate(lim.rolling)
        ]
        hit = None
        if len(r) > 4 + n:
            i = int(float(r[4 + n])) - 1
            hit = (windows[i][0], windows[i][2], windows[i][3])
        return TenantStatus(
            tenant,
            int(float(r[1])),
            lim.max_concurrent_runs,
            windows,
            hit,
            (float(r[2]), float(r[3])),
        )

    async def exhausted(self, tenant: str) -> tuple[str, float, float] | None:
        """``(metric, used, limit)`` of the first reached window, else ``None``."""
        return (await self.status(tenant)).exhausted
