"""Rejoining after a reconnect or a guard restart: how a re-registered run is rebuilt.

A part of :class:`guard.server.runs._registry.Registry` (``registry.rejoin``). A re-registration
(``Hello.live_runs``) carries the agent's snapshot of the run: the guard *sets* the run's
counters from it and keeps a :class:`~guard.server.runs._state.SeqGate` so every span the SDK
numbered (``guard.seq``) counts once, however often the exporter retries it to the restarted
guard. Numbered spans that arrive before their run is registered make a *provisional* run:
they wait, uncounted, until the agent registers it (``adopt``) or, if it never does, the
sweep records it once (``Lifecycle._agent_gone``). ``Hello.ended_runs`` names runs whose
records a guard already acknowledged: their provisional runs are dropped without a record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from guard.policy import Budget, DecidedBy, LoopDetector, Reason
from guard.server.decode._schema import SEQ, TENANT, Decoded
from guard.server.runs._scope import RunPart, Scope
from guard.server.runs._state import SeqGate
from guard.server.runs._table import PROVISIONAL_SPANS_MAX, PROVISIONAL_SPANS_TOTAL
from guard.server.runtime._auth import Principal

if TYPE_CHECKING:  # pragma: no cover
    from guard.server.decisions._router import DecisionRouter
    from guard.server.decode._schema import Observation
    from guard.server.runs._state import RunState

# the registry's span path, for the spans a provisional run kept (Registry.ingest: the
# applier it has at the time of the call)
Ingest = Callable[[Decoded, Principal], Any]

__all__ = ["PROVISIONAL_SPANS_MAX", "PROVISIONAL_SPANS_TOTAL", "Rejoin"]  # caps: see _table

_MAX_ENDED_IN_HELLO = 1024  # Hello.ended_runs read (the SDK sends at most that many)
_MAX_ID = 256


class Rejoin(RunPart):
    """Re-registration and provisional and remote runs of the table. Counts the spans a
    provisional run kept through ``ingest``, carries an operator's cancel over (and sends it
    again when the stream of a remote run moves) through ``decisions``, and untracks runs
    through ``forget`` (``Lifecycle.forget``)."""

    def __init__(
        self,
        scope: Scope,
        *,
        decisions: DecisionRouter,
        ingest: Ingest,
        forget: Callable[[RunState], None],
    ) -> None:
        super().__init__(scope)
        self.decisions = decisions
        self.ingest = ingest
        self._forget = forget
        self._remember_ended = scope.table.remember_ended

    def restore_usage(self, run: RunState, u: Any) -> None:
        """Set (never add) the run's own counters from its agent's snapshot. A parent's
        snapshot already holds its children's usage (the SDK reads a run tree at one
        instant), so adding through the parent chain would count the children twice; for
        the same reason only a root run's usage goes to the tenant's windows."""
        run.budget.restore(u)
        run.gate_tokens = u.input_tokens + u.output_tokens
        run.gate_cost_usd = u.cost_usd or 0.0
        if run.parent is None:
            self.budgets.restore(run.tenant, u)

    def adopt(self, run: RunState, waiting: RunState, kept: Any, principal: Principal) -> None:
        """The agent registered a run that spans had created first (provisional): count the
        spans it kept that the registration's snapshot does not hold, and carry over an
        operator's cancel (it reaches the agent now)."""
        self.stats["adopted_runs"] += 1
        if kept:
            decoded = Decoded()
            decoded.observations = kept
            self.ingest(decoded, principal)  # gated by run.seq_gate: each span counted once
        if waiting.stop_by is DecidedBy.OPERATOR and run.stop_reason is None:
            self.decisions.stop_run(
                run, Reason.OPERATOR_CANCEL, waiting.stop_detail, None, None, DecidedBy.OPERATOR
            )

    def ended_elsewhere(self, run_ids: Any, tenant: str) -> None:
        """Hello.ended_runs: runs whose records a guard (maybe this one before a restart)
        acknowledged. A provisional run for one of them (the exporter retried its spans) is
        dropped without a record, and later spans of it are late spans. Only the caller's
        tenant's runs are touched; a live registered run is left alone."""
        for run_id in run_ids[:_MAX_ENDED_IN_HELLO]:
            if not run_id or len(run_id) > _MAX_ID or run_id in self.ended:
                continue
            run = self.runs.get(run_id)
            if run is not None:
                if not run.provisional or (run.tenant and run.tenant != tenant):
                    continue
                self._forget(run)
            self._remember_ended(run_id)

    def gate(self, run: RunState, o: Observation) -> bool:
        """Whether a counted span of a gated run is *not* to be counted now (see
        ``RunState.seq_gate``): a provisional run keeps it for its agent's registration
        (bounded, then counted as dropped); a re-registered run skips it when the snapshot
        already holds it (``guard.seq <= span_seq``) or it was counted since (a retry)."""
        gate = run.seq_gate
        if type(gate) is list:
            run.touched_at = self.clock()
            self.table.touch((run,))  # heard from: the most recent of its tenant's LRU
            if not run.tenant and o[TENANT]:
                self.set_tenant(run, o[TENANT])
            if not gate:  # its first span: is its stream held by another replica?
                self.directory.watch(run)
            if not self.table.hold(gate, o):
                self.stats["provisional_spans_dropped"] += 1
            return True
        seq = o[SEQ]
        # a gated run that is not provisional has its SeqGate (the caller checked it is gated)
        if seq is not None and gate.seen(seq):  # type: ignore[union-attr]
            self.stats["replayed_spans"] += 1
            return True
        return False

    def set_tenant(self, run: RunState, tenant: str) -> None:
        """A provisional run learns its tenant from a later span (a step span carries it)."""
        self.table.set_tenant(run, tenant)

    # -- runs whose stream another replica holds (several replicas) ---------------------------
    def located(self, run: RunState, entry: Any) -> None:
        """The directory says another replica holds the stream of the provisional ``run``
        (``entry``: a ``DirEntry``): guard it here as a *remote* run with the limits and the
        identity its holder admitted it with, count the spans it kept, and route its
        decisions there. Its deadline stays the holder's (it has the agent's start time)."""
        if entry.ended:
            self._forget(run)
            self._remember_ended(run.run_id)
            return
        gate = run.seq_gate
        kept: list[Any] = gate if isinstance(gate, list) else []  # the spans held for it
        self._forget(run)
        if run.tenant and run.tenant != entry.tenant:
            # Another tenant's run: its spans are never counted nor its run touched (one id
            # cannot name two runs); dropped, like spans naming another tenant's local run.
            self.stats["foreign_remote_dropped"] = self.stats.get("foreign_remote_dropped", 0) + 1
            return
        limits = entry.limits or self.config.effective_limits(None)
        limits = dataclasses.replace(limits, deadline_s=None)
        run.seq_gate = SeqGate(0)  # each numbered span counts once, however often it is retried
        run.remote = entry.replica
        run.agent = entry.agent or run.agent
        run.parent_run_id = entry.parent_run_id
        run.tenant = entry.tenant
        parent = self.runs.get(entry.parent_run_id) if entry.parent_run_id else None
        run.parent = parent if parent is not None and parent.tenant == run.tenant else None
        run.budget = Budget(
            limits, parent=run.parent.budget if run.parent else None, clock=self.clock
        )
        run.detector = LoopDetector(limits.loop)
        self.table.add(run, span_only=True)
        self.stats["remote_runs"] = self.stats.get("remote_runs", 0) + 1
        if kept:
            decoded = Decoded()
            decoded.observations = kept
            self.ingest(decoded, Principal(tenant=run.tenant, admin=False))

    def remote_moved(self, run: RunState, holder: str) -> None:
        """The remote ``run``'s agent re-registered on another replica (its holder failed):
        decisions go there now. A cancel already sent to the old holder may have died with
        it: it is sent again (the new holder drops it if its run is already stopping)."""
        run.remote = holder
        self.decisions.resend_stop(run)

    def ended_remotely(self, run: RunState) -> None:
        """The directory says the remote ``run`` ended (its holder wrote the record)."""
        self._forget(run)
        self._remember_ended(run.run_id)
