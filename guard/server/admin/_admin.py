"""``GuardAdmin``: fleet cancel, live runs, tenant budgets and the store's report.

A tenant token sees and cancels only its own tenant's runs; ``--all`` needs the admin token.
Report reads the attached store in a worker thread (ClickHouse queries block). Stats (admin
only) returns the guard's figures: event-loop lag and the registry's counters. Every request
field is bounded (:mod:`guard.bounds`) before it is used; a long listing is built in slices
that yield to the event loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from guard.bounds import MAX_QUERY_UNIX_S, check_finite, check_id, check_text
from guard.errors import GuardUnavailable, InvalidInput
from guard.server._host import GuardHost
from guard.server.runs._state import RunState
from guard.server.runtime._auth import Principal
from guard.server.runtime._status import UnknownRun, grpc_errors
from guard.v1 import guard_pb2 as pb
from guard.v1 import guard_pb2_grpc
from guard.wire import (
    cancel_response_to_pb,
    list_runs_response_to_pb,
    run_status_to_pb,
    stats_response_to_pb,
    tenant_budgets_response_to_pb,
)

__all__ = ["AdminServicer", "local_statuses", "run_status"]

DEFAULT_LIST_LIMIT = 1000
MAX_LIST_LIMIT = 100_000
LIST_SLICE = 500  # run statuses built between two yields to the event loop
MAX_BUCKET_S = 366 * 86_400  # Report bucket width


def _fleet_partial(context: Any, missing: list[str]) -> None:
    """Several replicas: tell the caller which did not answer (trailer
    ``otel-guard-partial``; the answer holds what the others said)."""
    if missing:
        text = "; ".join(missing)[:1000]
        context.set_trailing_metadata((("otel-guard-partial", f"no answer from: {text}"),))


def _select(registry: Any, tenant: str, agent: str) -> list[RunState]:
    """The runs whose streams this replica holds (not the ones it guards for another),
    of ``tenant`` / ``agent`` when given, oldest first."""
    runs = registry.table.tenant_runs(tenant) if tenant else list(registry.runs.values())
    runs = [r for r in runs if r.remote is None and (not agent or r.agent == agent)]
    runs.sort(key=lambda r: r.started_at)
    return runs


def local_statuses(registry: Any, tenant: str, agent: str, limit: int) -> tuple[list, int]:
    """(statuses of at most ``limit`` of this replica's runs, how many it has): one
    replica's part of a fleet ListRuns."""
    runs = _select(registry, tenant, agent)
    return [run_status(r, registry.guard_id) for r in runs[:limit]], len(runs)


def run_status(run: RunState, guard_id: str = "") -> pb.RunStatus:
    budget = run.budget
    util, metric = budget.utilisation()
    if run.detached_at is not None:
        state = "detached"
    elif run.paused:
        state = "paused"
    elif run.stop_reason is not None:
        state = "stopping"
    else:
        state = "running"
    return run_status_to_pb(
        run_id=run.run_id,
        parent_run_id=run.parent_run_id,
        tenant=run.tenant,
        agent=run.agent,
        process_id=run.session.process_id if run.session is not None else "",
        usage=budget.usage(),
        limits=budget.limits,
        elapsed_s=budget.elapsed_s(),
        utilisation=util,
        metric=metric,
        state=state,
        connected=run.connected,
        guard_id=guard_id,
    )


class AdminServicer(guard_pb2_grpc.GuardAdminServicer):
    def __init__(self, app: GuardHost) -> None:
        self.app = app

    def _principal(self, context: grpc.aio.ServicerContext) -> Principal:
        return self.app.auth.principal(context.invocation_metadata())

    @grpc_errors
    async def Cancel(self, request: pb.CancelRequest, context: Any) -> pb.CancelResponse:
        principal = self._principal(context)
        target = request.selector.WhichOneof("target")
        if target is None:
            raise InvalidInput("selector is empty: give run_id, tenant, agent or all")
        value = getattr(request.selector, target)
        if target == "all" and not value:
            raise InvalidInput("selector.all must be true")
        if target != "all" and not value:
            raise InvalidInput(f"selector.{target} is empty")
        if target != "all":
            check_id(f"selector.{target}", value)
        check_text("reason", request.reason)
        registry = self.app.registry
        fleet = getattr(registry.bus, "fleet", None)
        if fleet is None:  # one guard process
            ids = registry.cancel(target, value, request.reason, principal)
            return cancel_response_to_pb(ids)
        ids, missing = await fleet.cancel(target, value, request.reason, principal)
        _fleet_partial(context, missing)
        if target == "run_id" and not ids:
            registry.get(value, principal)  # raises NOT_FOUND (the fleet has no such run)
            raise UnknownRun(f"run {value[:64]!r} is not live on this guard")
        return cancel_response_to_pb(ids)

    @grpc_errors
    async def ListRuns(self, request: pb.ListRunsRequest, context: Any) -> pb.ListRunsResponse:
        principal = self._principal(context)
        tenant = check_id("tenant", request.tenant)
        check_id("agent", request.agent)
        tenant = principal.scope_tenant(tenant, "list")
        registry = self.app.registry
        limit = min(request.limit or DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT)
        fleet = getattr(registry.bus, "fleet", None)
        if fleet is not None and not request.local:  # several replicas: each lists its runs
            statuses, total, missing = await fleet.list_runs(tenant, request.agent, limit)
            _fleet_partial(context, missing)
            return list_runs_response_to_pb(statuses, total)
        runs = _select(registry, tenant, request.agent)
        total = len(runs)
        statuses = []
        for start in range(0, min(limit, total), LIST_SLICE):
            if start:
                await asyncio.sleep(0)
            # a run may have ended while this listing yielded: list the ones still live
            statuses.extend(
                run_status(r)
                for r in runs[start : min(start + LIST_SLICE, limit)]
                if registry.runs.get(r.run_id) is r
            )
        return list_runs_response_to_pb(statuses, total)

    @grpc_errors
    async def TenantBudgets(
        self, request: pb.TenantBudgetsRequest, context: Any
    ) -> pb.TenantBudgetsResponse:
        principal = self._principal(context)
        budgets = self.app.registry.budgets
        check_id("tenant", request.tenant)
        if request.tenant:
            principal.check_tenant(request.tenant, "the budget")
            names = [request.tenant]
        elif principal.tenant is not None:
            names = [principal.tenant]
        else:
            names = budgets.known()
        if len(names) == 1:  # one tenant: fresh from the shared store (replicas)
            return tenant_budgets_response_to_pb([await budgets.fleet_status(names[0])])
        return tenant_budgets_response_to_pb([budgets.status(n) for n in names])

    @grpc_errors
    async def Report(self, request: pb.ReportRequest, context: Any) -> pb.ReportResponse:
        principal = self._principal(context)
        tenant = check_id("tenant", request.tenant) or None
        check_id("agent", request.agent)
        since = until = None
        if request.HasField("since_unix"):
            since = check_finite("since_unix", request.since_unix, MAX_QUERY_UNIX_S)
        if request.HasField("until_unix"):
            until = check_finite("until_unix", request.until_unix, MAX_QUERY_UNIX_S)
        if request.bucket_s > MAX_BUCKET_S:
            raise InvalidInput(f"bucket_s {request.bucket_s} exceeds {MAX_BUCKET_S}")
        tenant = principal.scope_tenant(tenant, "report on")
        store = self.app.sink
        report = getattr(store, "report", None)
        if report is None:
            raise GuardUnavailable(
                "this guard has no store attached (started without ClickHouse): "
                "run `otel-guard report --clickhouse DSN` against the store directly"
            )
        result = await asyncio.to_thread(
            report,
            since=since,
            until=until,
            tenant=tenant,
            agent=request.agent or None,
            bucket_s=request.bucket_s or 60,
        )
        # The store's own conversion keeps its convention: unknown (None) travels as NaN.
        from guard.store import report_to_pb

        return report_to_pb(result)

    @grpc_errors
    async def Stats(self, request: pb.StatsRequest, context: Any) -> pb.StatsResponse:
        """The guard's figures (admin token only): see ``GuardServer.figures``."""
        self._principal(context).require_admin("Stats")
        return stats_response_to_pb(self.app.guard_id, self.app.figures())
