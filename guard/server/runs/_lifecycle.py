"""Ending runs: RunEnded from the agent, guard-side ends (agent_lost, operator cancel of an
unreachable run, the run span of a span-only run) and housekeeping.

A part of :class:`guard.server.runs._registry.Registry` (``registry.lifecycle``). Every way out
writes exactly one ``Outcome`` to the sink; ``ended`` remembers recent run ids so duplicates
and late spans are dropped.

A record the sink could not make durable (it raised: the store's disk is full) is *not*
acknowledged. The run is ended on the guard all the same (its grant given back, late spans
dropped), and the record waits in ``unwritten`` (bounded, :data:`UNWRITTEN_MAX`): the sweep
offers it to the sink again with a jittered backoff and acknowledges it on its stream once
the sink took it; a resend of it from the agent (after a reconnect) is that same record,
written then if it still waits, acknowledged as a repeat if it was written meanwhile.
"""

from __future__ import annotations

import logging
import random
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from guard.errors import StoreError
from guard.policy import DecidedBy, Outcome, Reason, Status
from guard.server.runs._scope import RunPart, Scope
from guard.server.runs._table import ENDED_MEMORY
from guard.server.runtime._ordered import OrderedSet
from guard.wire import record_ack_to_pb

if TYPE_CHECKING:  # pragma: no cover
    from guard.server.control._fanout import AgentSession
    from guard.server.runs._state import RunState
    from guard.server.runtime._auth import Principal

__all__ = ["ENDED_MEMORY", "UNWRITTEN_MAX", "Lifecycle", "Readiness"]  # ENDED_MEMORY: see _table

log = logging.getLogger("guard.server")
SPAN_ONLY_IDLE_S = 600.0  # a run seen only through spans is forgotten after this much silence
# Records the sink refused kept for another try. Past it the oldest agent record is let go
# (never acknowledged: its agent still holds it and resends it after a reconnect).
UNWRITTEN_MAX = 10_000
_RETRY_MIN_S, _RETRY_MAX_S = 0.25, 5.0
_RETRY_PER_SWEEP = 2_000  # a sweep's slice: the loop is not held by a long catch-up


class Lifecycle(RunPart):
    """How the runs in ``table`` end: each way out gives back what the run held (the
    tenant's slot and grant in ``budgets``, its stream's entry in ``directory``) and writes
    its one record to ``sink``; the periodic :meth:`sweep` ends what its agent left behind
    (and expires the unacked commands of ``sessions``)."""

    def __init__(
        self,
        scope: Scope,
        sink: Any,
        *,
        sessions: OrderedSet[AgentSession],
    ) -> None:
        super().__init__(scope)
        self.detached = scope.table.detached
        self.span_only = scope.table.span_only
        self.sink = sink
        self.sessions = sessions
        self.grace_s = float(scope.config.guard.agent_grace_s)
        self._asking: set[str] = set()  # run ids the directory was asked about (sweep)
        # run id -> (its record, the stream to acknowledge it on: None for the guard's own)
        self.unwritten: OrderedDict[str, tuple[Outcome, AgentSession | None]] = OrderedDict()
        self._retry_at = 0.0
        self._retry_backoff_s = 0.0

    def ended_by_agent(self, session: AgentSession | None, outcome: Outcome, principal: Principal):
        """RunEnded: the agent's outcome is the record (first one wins). Acknowledged with
        RecordAck once the sink holds it durably (the store's WAL), a repeat at once: the
        agent resends it until then. A record the sink refused is not acknowledged; it waits
        in ``unwritten`` (module docstring), and a resend of it is the same record."""
        run = self.runs.get(outcome.run_id)
        if run is not None and principal.tenant is not None and run.tenant != principal.tenant:
            # Another tenant's live run: never end it, never write over its record. Answered
            # exactly like a repeat of a record already written (acked, nothing changes).
            self._ack_record(session, outcome.run_id)
            return
        if not outcome.tenant:
            outcome.tenant = run.tenant if run is not None else (principal.tenant or "")
        principal.check_tenant(run.tenant if run is not None else outcome.tenant)
        if run is not None:
            self.finish(run, outcome)  # its grant back, but the tail its final usage announces
        elif outcome.run_id in self.ended or outcome.run_id in self.unwritten:
            waiting = self.unwritten.get(outcome.run_id)
            if waiting is None:
                self._ack_record(session, outcome.run_id)  # a repeat: changes nothing
            elif principal.tenant is not None and waiting[0].tenant != principal.tenant:
                self._ack_record(session, outcome.run_id)  # another tenant's: as a repeat
            else:
                # The agent resent a record the sink refused: the first one is the record.
                self.unwritten[outcome.run_id] = (waiting[0], session)
                if self._write_run(waiting[0], quiet=True):
                    del self.unwritten[outcome.run_id]
                    self._ack_record(session, outcome.run_id)
            return
        self.remember_ended(outcome.run_id)
        if self._write_run(outcome):
            self._ack_record(session, outcome.run_id)
        else:
            self._keep_unwritten(outcome, session)

    def _ack_record(self, session: AgentSession | None, run_id: str) -> None:
        if session is not None:
            self.stats["records_acked"] += 1
            msg, body = session.compose("record_ack")
            record_ack_to_pb(run_id, into=body)
            session.post(msg)

    def end_run(
        self, run: RunState, status: Status, reason: Reason, message: str, decided_by: DecidedBy
    ) -> Outcome:
        """End a run on the guard's side and write its outcome."""
        outcome = Outcome.from_usage(
            run.budget.usage(),
            limits=run.budget.limits,
            elapsed_s=run.budget.elapsed_s(),
            run_id=run.run_id,
            status=status,
            reason=reason,
            message=message,
            parent_run_id=run.parent_run_id or None,
            tenant=run.tenant,
            agent=run.agent,
            trace_id=run.trace_id.hex(),
            last_tool=run.last_tool,
            last_action_hash=run.last_action_hash,
            loop_hits=run.detector.hits,
            decided_by=decided_by,
            price_book_version=self.config.prices.version or "",
            started_at=run.started_at,
            ended_at=time.time(),
        )
        self.finish(run)
        self.remember_ended(run.run_id)
        if run.remote is not None:
            # its stream's replica writes the one record (this one only counted its spans)
            self.stats["remote_ends"] = self.stats.get("remote_ends", 0) + 1
            return outcome
        if not self._write_run(outcome):
            self._keep_unwritten(outcome, None)
        return outcome

    def _write_run(self, outcome: Outcome, *, quiet: bool = False) -> bool:
        """Hand the record to the sink; True when it returned (then it is durable: the store
        appends to its WAL before returning). False when it raised: not durable, so not to
        be acknowledged. A StoreError (the store's disk is full: it logs that condition
        once) is counted, not logged per record."""
        try:
            self.sink.write_run(outcome)
        except StoreError as ex:
            self.stats["records_unacked"] = self.stats.get("records_unacked", 0) + 1
            if not quiet:
                log.debug("guard: the record of run %r is not durable: %s", outcome.run_id, ex)
            return False
        except Exception:
            self.stats["records_unacked"] = self.stats.get("records_unacked", 0) + 1
            log.exception("guard: writing the record of run %r failed", outcome.run_id[:64])
            return False
        return True

    def _keep_unwritten(self, outcome: Outcome, session: AgentSession | None) -> None:
        """Keep a record the sink refused for the sweep to offer again (bounded)."""
        self.unwritten[outcome.run_id] = (outcome, session)
        self.unwritten.move_to_end(outcome.run_id)
        if self._retry_at <= 0.0:
            self._retry_at = self.clock() + _RETRY_MIN_S * random.uniform(0.5, 1.0)
        while len(self.unwritten) > UNWRITTEN_MAX:
            # Let go of an agent's record first (the oldest): never acknowledged, its agent
            # still holds it and resends it after a reconnect, and then it must be written
            # as a new record, not acknowledged as a repeat. The guard's own records have
            # no other copy: one goes only when nothing else is left to let go of.
            old_id = next((r for r, (_, s) in self.unwritten.items() if s is not None), None)
            if old_id is None:
                old_id = next(iter(self.unwritten))
            old, old_session = self.unwritten.pop(old_id)
            if old_session is not None:
                self.ended.pop(old_id, None)
            else:
                self.stats["records_lost"] = self.stats.get("records_lost", 0) + 1
                log.error(
                    "guard: LOST the guard's record of run %r (%s): the store refused it and "
                    "%d records already wait for it",
                    old_id,
                    old.reason,
                    UNWRITTEN_MAX,
                )

    def retry_unwritten(self, limit: int = _RETRY_PER_SWEEP) -> None:
        """Offer the records the sink refused to it again, oldest first, once the jittered
        backoff is due; each one it takes is acknowledged on its stream (if that stream
        is still open; otherwise the agent's resend after its reconnect is acked as a
        repeat). Stops at the first refusal: the sink is still full."""
        if not self.unwritten or self.clock() < self._retry_at:
            return
        for run_id in list(self.unwritten)[:limit]:
            outcome, session = self.unwritten[run_id]
            if not self._write_run(outcome, quiet=True):
                self._retry_backoff_s = min(
                    _RETRY_MAX_S, max(_RETRY_MIN_S, self._retry_backoff_s * 2)
                )
                self._retry_at = self.clock() + self._retry_backoff_s * random.uniform(0.5, 1.0)
                return
            del self.unwritten[run_id]
            self._ack_record(session, run_id)
        self._retry_backoff_s = 0.0
        self._retry_at = 0.0 if not self.unwritten else self.clock()

    def durable(self) -> bool:
        """Whether records are being made durable: False while any waits in ``unwritten``
        or the sink reports its disk full (``disk_full``). The guard's readiness."""
        return not self.unwritten and not getattr(self.sink, "disk_full", False)

    def remember_ended(self, run_id: str) -> None:
        """Late spans and repeated RunEnded of ``run_id`` are dropped from now on."""
        self.table.remember_ended(run_id)

    def finish(self, run: RunState, outcome: Outcome | None = None) -> None:
        """Give back all the run held and forget it (the caller writes its record, if any).
        ``outcome``: the agent's record (RunEnded), whose final usage keeps its tail held."""
        self.budgets.release(run, outcome)  # once per way out: the tenant's grant back
        self.forget(run)
        if run.admitted:
            self.budgets.run_ended(run.tenant)
            run.admitted = False

    def forget(self, run: RunState) -> None:
        """Untrack the run (and release its stream's directory entry); the tenant's slot
        and grant stay with the caller (:meth:`finish` gives them back)."""
        self.table.forget(run)  # and the spans a provisional run held (Rejoin._gate)
        self.directory.release(run)

    def moved_away(self, run: RunState, holder: str) -> None:
        """Another replica holds ``run``'s stream now (its agent re-registered there after a
        failover): no agent_lost here, the record is that replica's. Its spans may still
        come here, so it stays guarded as a remote run; the tenant's slot is the holder's."""
        if run.connected or run.run_id not in self.runs:
            return
        run.remote = holder  # first: the shared budgets free nothing of a remote run
        self.budgets.release(run)
        if run.admitted:
            self.budgets.run_ended(run.tenant)
            run.admitted = False
        self.directory.release(run)
        run.session = None
        run.detached_at = None
        self.table.remote(run)

    # -- housekeeping ----------------------------------------------------------------------
    def sweep(self, limit: int | None = None) -> bool:
        """Periodic: agent_lost after grace, idle span-only runs, unacked decisions.

        ``limit``: end at most that many runs of each kind, so a mass disconnect is ended in
        slices (the server yields to its loop between calls); True when work is left.
        """
        now = self.clock()
        asking = self._asking  # asked about by an earlier sweep: not again until answered
        lost = [
            r
            for r in self.detached.values()
            if r.detached_at is not None
            and now - r.detached_at >= self.grace_s
            and r.run_id not in asking
        ]
        # provisional: spans of a run whose agent never came back to register it
        # Both walk the tenants' LRUs from their stalest (RunTable.stale_span_only): a guard
        # holding its cap of span-only runs does not scan them all four times a second.
        stale = self.table.stale_span_only(now, min(self.grace_s, SPAN_ONLY_IDLE_S))
        unclaimed = [r for r in stale if r.provisional and r.run_id not in asking]
        unclaimed = [r for r in unclaimed if now - r.touched_at >= self.grace_s]
        idle = [r for r in stale if now - r.touched_at > SPAN_ONLY_IDLE_S]
        more = limit is not None and any(len(x) > limit for x in (lost, unclaimed, idle))
        # its agent may have re-registered on another replica that this one has not heard
        # of yet: the directory says, and hands it over, before any agent_lost is written
        ask = lost[:limit] + unclaimed[:limit]
        asking.update(r.run_id for r in ask)
        self.directory.confirm_lost(ask, self._confirmed)
        for run in idle[:limit]:
            if run.run_id in self.runs:
                self.finish(run)
        for session in list(self.sessions):
            session.expire(now)
        self.budgets.renew()
        self.retry_unwritten()
        return more

    def _confirmed(self, run: RunState, moved: bool) -> None:
        """The directory's answer on a run the sweep found past its grace: unless another
        replica holds it now (then it was handed over), end it, if it still waits for its
        agent (it may have come back, or ended, while the directory was asked)."""
        self._asking.discard(run.run_id)
        if moved or self.runs.get(run.run_id) is not run:
            return
        now = self.clock()
        if self.detached.get(run.run_id) is run:
            since = run.detached_at
            if since is not None and now - since >= self.grace_s:
                self._agent_gone(run, f"agent stream lost for {now - since:.1f}s")
        elif run.provisional and now - run.touched_at >= self.grace_s:
            self._agent_gone(run, f"agent did not register the run within {self.grace_s:g}s")

    def _agent_gone(self, run: RunState, why: str) -> None:
        """The record of a run whose agent did not come back within the grace period: an
        operator's cancel if one is pending, else what its run span said (decided_by sdk), else
        agent_lost. Tenant and agent are whatever its spans carried."""
        if run.stop_by is DecidedBy.OPERATOR:
            self.end_run(
                run, Status.CANCELLED, Reason.OPERATOR_CANCEL, run.stop_detail, run.stop_by
            )
            return
        if run.end_hint is not None:
            status, reason = run.end_hint
            by = run.stop_by if run.stop_by is not None and reason is run.stop_reason else None
            self.end_run(run, status, reason, f"from the run span ({why})", by or DecidedBy.SDK)
            return
        self.stats["agent_lost"] += 1
        self.end_run(
            run,
            Status.FAILED,
            Reason.AGENT_LOST,
            f"{why} (agent_grace_s={self.grace_s:g})",
            DecidedBy.GUARD,
        )


class Readiness:
    """The guard's gRPC health while its records cannot be made durable (disk full).

    Readiness, not liveness: the overall status (``""``) and ``guard.v1.GuardControl`` go
    NOT_SERVING while :meth:`Lifecycle.durable` is False, so a load balancer or an
    orchestrator's readiness probe sends agents to another guard (whose disk takes their
    records) instead of to one that cannot acknowledge them; they go back to SERVING once the
    records are durable again. The process is not restarted for it (a restart would not free
    the disk, and records kept in memory for it would have to be recovered from the WAL).
    The OTLP and admin services stay SERVING: spans still guard the live runs, and the admin
    service reports the condition (``Stats``: ``store_disk_full``, ``store_records_held``).
    Nothing changes once the guard drains (its health is NOT_SERVING for good then).
    """

    def __init__(self, health: Any, services: tuple[str, ...]) -> None:
        self.health = health
        self.services = services
        self.ready = True

    async def update(self, lifecycle: Lifecycle, draining: bool) -> None:
        """Set the health of ``services`` from ``lifecycle.durable()`` when it changed."""
        ready = lifecycle.durable()
        if ready == self.ready or draining:
            return
        from grpc_health.v1 import health_pb2

        self.ready = ready
        status = health_pb2.HealthCheckResponse
        for name in self.services:
            await self.health.set(name, status.SERVING if ready else status.NOT_SERVING)
