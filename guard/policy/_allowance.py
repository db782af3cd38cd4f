"""Tenant allowances: slices of a tenant's rolling ``cost_usd`` / ``tokens`` windows granted to
its live root runs, so a tenant budget holds across processes (in the style of Envoy's
rate-limit quota service, RLQS).

Accounting, per tenant and per metric with a window (``cost_usd``, ``tokens``):

* a run's **grant** is a *ceiling on its cumulative usage* (the run's whole life, sub-agents
  included), so a repeated or reordered message is harmless;
* its **seen** usage is what the guard has observed of it (that usage is in the windows);
* its **outstanding** grant is ``max(0, ceiling - seen)``: granted but not yet spent;
* the invariant: ``window used + held reservations + all outstanding grants <= limit`` after
  every grant, and no spend within a grant can break it (a spend moves an amount from the
  outstanding grant into the window). Only usage *beyond* a grant (a run that did not ask, an
  estimate that was too low) can push the total past the limit, by exactly that excess.

A grant answers a request for ``need`` more with exactly ``need`` (the reservation of the
call about to start), or nothing at all with ``exhausted`` when it does not fit. Nothing is
granted ahead of a need, so what runs hold is what their calls in flight reserved (and what
they spent that the guard has not seen yet): a run is refused only when the spend plus those
reservations leave less than it asks, and no idle run sits on the tenant's window. A grant
costs the agent one round trip on its control stream, which is small against the call it
covers. A run that ends gives back its outstanding grant, except the part its final usage
says is still on the way (spans that arrive after the run ended): that *tail* stays held
until those spans are seen or ``tail_s`` passes.

Pure: no I/O, and thread-safe (one lock per tenant).
"""

from __future__ import annotations

import heapq
import math
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

from guard.errors import InvalidInput
from guard.policy._rolling import TenantBudget

__all__ = ["ALLOWANCE_METRICS", "AllowanceGrant", "TenantAllowances", "short_of_grant"]

ALLOWANCE_METRICS = ("cost_usd", "tokens")
_EPS = 1e-12


def short_of_grant(
    tenant: str, metric: str, need: float, available: float, limit: float, used: float, out: float
) -> str:
    """Why a grant was refused: the detail every guard gives for an exhausted allowance."""
    return (
        f"tenant {tenant}: {metric} needs {need:g} more, {available:g} left to grant "
        f"(limit {limit:g}, spent {used:g}, reserved by runs in flight {out:g})"
    )


class AllowanceGrant(NamedTuple):
    """A run's ceilings after a grant (``None`` = that metric has no tenant window).

    Immutable (a named tuple: one is made per admission on the guard's control path, at a
    fraction of a frozen dataclass's cost)."""

    run_id: str
    max_cost_usd: float | None
    max_tokens: float | None
    exhausted: bool = False
    detail: str = ""


class _Entry:
    __slots__ = ("ceiling", "expires_at", "seen")

    def __init__(self, seen: list[float]) -> None:
        self.seen = list(seen)
        self.ceiling = list(seen)  # nothing granted yet
        self.expires_at: float | None = None  # set once the run ended (its tail)

    def outstanding(self, i: int) -> float:
        return max(0.0, self.ceiling[i] - self.seen[i])


class TenantAllowances:
    """The grants of one tenant (see the module docstring for the accounting).

    Each admission of a root run grants and each end releases, so these run once per run on
    the guard's control path. They keep their arithmetic exactly (the same operations in the
    same order: ``tests/policy/test_policy_allowance_reference.py`` holds them equal to the
    code they replaced, bit for bit) with few calls: ``max``/``min`` of two floats written
    inline as ``b if b > a else a`` (which is what ``max(a, b)`` returns, ties and signed
    zeros included), the limits of the tenant's windows read once per policy
    (:meth:`_spec`), the tails looked at only when one is due.
    """

    def __init__(self, budget: TenantBudget, *, tail_s: float = 5.0):
        self.budget = budget
        self.tail_s = tail_s
        self._entries: dict[str, _Entry] = {}
        # The budget's own lock and its list of outstanding grants per metric: its
        # reservations and these grants are checked against each other atomically.
        self._out = budget._granted
        # The tails by when they expire, a heap of (expires_at, run id): expiring them costs
        # O(log n) per tail instead of a scan of every entry at each grant (O(live runs) per
        # admission: 37% of the control path's CPU on benchmarks/bench_ingest.py's fleet).
        self._tails: list[tuple[float, str]] = []
        self._lock = budget._lock
        self._spec_of: tuple[Any, tuple[float, float], tuple[bool, bool]] | None = None

    # -- reading ----------------------------------------------------------------------------
    def tracked(self) -> bool:
        """Whether the tenant has a window an allowance can be cut from."""
        return any(r.metric in ALLOWANCE_METRICS for r in self.budget.limits.rolling)

    def outstanding(self) -> tuple[float, float]:
        """Granted but unspent (cost_usd, tokens), over every run of the tenant."""
        with self._lock:
            return (self._out[0], self._out[1])

    def grant_of(self, run_id: str) -> AllowanceGrant | None:
        with self._lock:
            e = self._entries.get(run_id)
            return None if e is None else self._grant_locked(run_id, e)

    def __contains__(self, run_id: str) -> bool:
        return run_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    # -- grants -----------------------------------------------------------------------------
    def grant(
        self,
        run_id: str,
        now: float,
        *,
        need_cost_usd: float = 0.0,
        need_tokens: float = 0.0,
        seen: tuple[float, float] = (0.0, 0.0),
    ) -> AllowanceGrant:
        """Grant ``run_id`` exactly the ``need`` more (nothing when nothing is needed, e.g.
        at admission: its entry then starts at what it has ``seen``), all or nothing: when ``need`` does not fit under what the tenant has
        left, nothing changes and the answer is ``exhausted``. ``seen`` is the run's usage
        already in the windows when it is new here (a run re-registered after a restart)."""
        need = _finite_pair(need_cost_usd, need_tokens)
        with self._lock:
            if self._tails and self._tails[0][0] <= now:
                self._expire_locked(now)
            e = self._entries.get(run_id)
            if e is None:
                e = self._entries[run_id] = _Entry(list(_finite_pair(seen[0], seen[1])))
            if e.expires_at is not None:  # ended: nothing more for it
                return self._grant_locked(run_id, e)
            head = self.budget._headroom_locked(now)
            limits = self._spec()[1]
            out = self._out
            for i in (0, 1):
                h = head[i]
                if h is None:
                    continue
                available = h - out[i]
                if not available > 0.0:
                    available = 0.0
                n = need[i]
                if n > available + _EPS:
                    self.budget._refused[i] = n  # new runs are denied meanwhile
                    return self._exhausted_locked(run_id, e, i, n, available, h, limits[i])
            seen_, ceiling = e.seen, e.ceiling
            for i in (0, 1):
                # exactly the need (capped by what is left, within _EPS): a grant is the
                # call's own reservation, never a slice the run could sit on
                n, h = need[i], head[i]
                if n > 0.0 and h is not None:
                    available = h - out[i]
                    add = n if n < available else (available if available > 0.0 else 0.0)
                    s, c = seen_[i], ceiling[i]
                    before = c - s if c - s > 0.0 else 0.0
                    c = ceiling[i] = (s if s > c else c) + add
                    out[i] += (c - s if c - s > 0.0 else 0.0) - before
            return self._grant_locked(run_id, e)

    def _exhausted_locked(
        self, run_id: str, e: _Entry, i: int, need: float, available: float, h: float, lim: float
    ) -> AllowanceGrant:
        detail = short_of_grant(
            self.budget.tenant, ALLOWANCE_METRICS[i], need, available, lim, lim - h, self._out[i]
        )
        return self._grant_locked(run_id, e)._replace(exhausted=True, detail=detail)

    def _spec(self) -> tuple[Any, tuple[float, float], tuple[bool, bool]]:
        """(the budget's limits, the tightest limit of each metric, whether it has a window),
        read again only when the budget's limits are replaced (a policy reload)."""
        spec, limits = self._spec_of, self.budget.limits
        if spec is None or spec[0] is not limits:
            tightest, has = [math.inf, math.inf], [False, False]
            for r in limits.rolling:
                if r.metric in ALLOWANCE_METRICS:
                    i = ALLOWANCE_METRICS.index(r.metric)
                    tightest[i] = min(tightest[i], r.limit)
                    has[i] = True
            spec = self._spec_of = (limits, (tightest[0], tightest[1]), (has[0], has[1]))
        return spec

    def _grant_locked(self, run_id: str, e: _Entry) -> AllowanceGrant:
        has, ceiling = self._spec()[2], e.ceiling
        return AllowanceGrant(
            run_id, ceiling[0] if has[0] else None, ceiling[1] if has[1] else None
        )

    # -- spending and releasing ---------------------------------------------------------------
    def observe(self, run_id: str, cost_usd: float, tokens: float) -> None:
        """The run's cumulative usage as the guard now sees it (it only grows): what it
        spent moves from its outstanding grant into the windows."""
        v = _finite_pair(cost_usd, tokens)
        with self._lock:
            e = self._entries.get(run_id)
            if e is not None:
                self._set_seen_locked(e, v, cumulative=True)

    def observe_many(self, items: list[tuple[str, float, float]]) -> None:
        """:meth:`observe` for several runs ``(run_id, cost_usd, tokens)`` in one lock (the
        guard's per-request batch; the values come from budgets, which only hold finite
        amounts >= 0)."""
        entries = self._entries
        with self._lock:
            for run_id, cost, tokens in items:
                e = entries.get(run_id)
                if e is not None and (cost > e.seen[0] or tokens > e.seen[1]):
                    self._set_seen_locked(e, [cost, tokens], cumulative=True)

    def spend_late(self, run_id: str, cost_usd: float, tokens: float) -> None:
        """Usage of a run that already ended (its late spans): consumes its tail."""
        v = [_finite(cost_usd), _finite(tokens)]
        with self._lock:
            e = self._entries.get(run_id)
            if e is not None:
                self._set_seen_locked(e, v, cumulative=False)
                if all(e.outstanding(i) <= _EPS for i in range(2)):
                    self._drop_locked(run_id)

    def _set_seen_locked(self, e: _Entry, v: Sequence[float], *, cumulative: bool) -> None:
        seen, ceiling, out = e.seen, e.ceiling, self._out
        for i in (0, 1):
            s, c = seen[i], ceiling[i]
            before = c - s if c - s > 0.0 else 0.0
            if cumulative:
                if v[i] > s:
                    s = v[i]
            else:
                s = s + v[i]
            seen[i] = s
            o = out[i] = out[i] + ((c - s if c - s > 0.0 else 0.0) - before)
            if -1e-9 < o < 1e-9:  # abs(o) < 1e-9: float drift around an empty ledger
                out[i] = o if o > 0.0 else 0.0

    def release(
        self,
        run_id: str,
        now: float,
        *,
        final: tuple[float, float] | None = None,
        seen: tuple[float, float] | None = None,
    ) -> None:
        """The run ended (any way). Its outstanding grant goes back to the tenant, except a
        tail up to its ``final`` cumulative usage (the agent's count) not seen yet, held for
        ``tail_s`` for the spans still on their way. ``seen``: the run's cumulative usage as
        the guard sees it now, observed first (exactly :meth:`observe`, in the same lock).
        Idempotent."""
        v = None if seen is None else _finite_pair(seen[0], seen[1])
        with self._lock:
            e = self._entries.get(run_id)
            if e is None:
                return
            if v is not None:
                self._set_seen_locked(e, v, cumulative=True)
            if e.expires_at is not None:
                return
            if final is None:
                self._drop_locked(run_id)
                return
            seen_, ceiling, out = e.seen, e.ceiling, self._out
            for i in (0, 1):
                s, c = seen_[i], ceiling[i]
                before = c - s if c - s > 0.0 else 0.0
                f = _finite(final[i])
                top = f if f > s else s
                c = ceiling[i] = top if top < c else c
                out[i] += (c - s if c - s > 0.0 else 0.0) - before
            left0, left1 = ceiling[0] - seen_[0], ceiling[1] - seen_[1]
            if (left0 if left0 > 0.0 else 0.0) <= _EPS and (left1 if left1 > 0.0 else 0.0) <= _EPS:
                self._drop_locked(run_id)
            else:
                e.expires_at = now + self.tail_s
                heapq.heappush(self._tails, (e.expires_at, run_id))

    def _drop_locked(self, run_id: str) -> None:
        e = self._entries.pop(run_id, None)
        if e is not None:
            out, seen, ceiling = self._out, e.seen, e.ceiling
            for i in (0, 1):
                left = ceiling[i] - seen[i]
                o = out[i] - (left if left > 0.0 else 0.0)
                out[i] = o if o > 0.0 else 0.0

    def _expire_locked(self, now: float) -> None:
        tails = self._tails
        while tails and tails[0][0] <= now:
            expires_at, rid = heapq.heappop(tails)
            e = self._entries.get(rid)
            # still that tail (not dropped since, nor a new entry under the same id)
            if e is not None and e.expires_at == expires_at:
                self._drop_locked(rid)

    def expire(self, now: float) -> None:
        """Give back the tails whose time is up."""
        with self._lock:
            self._expire_locked(now)


_FLOAT_MAX = sys.float_info.max


def _finite_pair(a: float, b: float) -> tuple[float, float]:
    """``(_finite(a), _finite(b))`` in one call (the same values, the same refusals)."""
    a, b = float(a), float(b)
    if not (0.0 <= a <= _FLOAT_MAX and 0.0 <= b <= _FLOAT_MAX):  # NaN fails them too
        _finite(a)
        _finite(b)
    return (a, b)


def _finite(v: float) -> float:
    v = float(v)
    if not math.isfinite(v) or v < 0:
        raise InvalidInput(f"allowance amounts must be finite and >= 0, got {v!r}")
    return v
