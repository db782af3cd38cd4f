"""The report read path: stop-reason distribution and series from ``stop_reasons_1m``.

Rows and series points are plain dicts with the field names of the proto messages
``DistributionRow`` and ``SeriesPoint``. Unknown values (no priced run -> no cost) are
``None`` here and NaN on the wire; :func:`report_to_pb` / :func:`report_from_pb` convert.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, TypedDict

__all__ = ["Report", "ReportQuery", "query_report", "report_from_pb", "report_to_pb"]

ROW_FIELDS = (
    "status", "reason", "runs", "steps", "tokens", "cost_usd",
    "p50_steps", "p95_steps", "p95_cost_usd", "p95_elapsed_ms",
)  # fmt: skip
SERIES_FIELDS = ("bucket_start_unix", "status", "reason", "runs", "cost_usd")
MAX_BUCKETS = 1440  # a day of minutes; wider ranges get wider buckets


@dataclass(slots=True)
class Report:
    """``rows``: one per (status, reason), most runs first. ``series``: per bucket, in time order."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    series: list[dict[str, Any]] = field(default_factory=list)

    @property
    def total_runs(self) -> int:
        return sum(r["runs"] for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [dict(r) for r in self.rows], "series": [dict(p) for p in self.series]}


class ReportQuery(TypedDict, total=False):
    """The keywords of :func:`query_report`, for the read paths that hand them on."""

    since: float | None
    until: float | None
    tenant: str | None
    agent: str | None
    bucket_s: int


def _where(
    since: float | None, until: float | None, tenant: str | None, agent: str | None
) -> tuple[str, dict]:
    # stop_reasons_1m is per minute: both ends round down to the minute, so adjacent windows
    # [a, b) and [b, c) partition the runs exactly.
    conds: list[str] = []
    params: dict[str, object] = {}
    if since is not None:
        conds.append("minute >= toStartOfMinute(toDateTime({since:Float64}, 'UTC'))")
        params["since"] = float(since)
    if until is not None:
        conds.append("minute < toStartOfMinute(toDateTime({until:Float64}, 'UTC'))")
        params["until"] = float(until)
    if tenant:
        conds.append("tenant = {tenant:String}")
        params["tenant"] = tenant
    if agent:
        conds.append("agent = {agent:String}")
        params["agent"] = agent
    return (" WHERE " + " AND ".join(conds)) if conds else "", params


def _num(x: Any) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def query_report(
    client: Any,
    database: str,
    *,
    since: float | None = None,
    until: float | None = None,
    tenant: str | None = None,
    agent: str | None = None,
    bucket_s: int = 60,
) -> Report:
    """Read the distribution with -Merge combinators (the table is only eventually merged).

    ``bucket_s`` is rounded to whole minutes and doubled until the series has at most
    MAX_BUCKETS buckets, so a month at the default 60 s does not return 40k points per reason.
    """
    where, params = _where(since, until, tenant, agent)
    rows_sql = f"""
        SELECT status, reason, sum(runs) AS n, sum(steps_sum),
               sum(input_tokens_sum) + sum(output_tokens_sum), sum(cost_usd_sum), sum(priced_runs),
               quantilesMerge(0.5, 0.95, 0.99)(steps_q),
               quantilesMerge(0.5, 0.95, 0.99)(cost_usd_q),
               quantilesMerge(0.5, 0.95, 0.99)(elapsed_ms_q)
        FROM {database}.stop_reasons_1m{where}
        GROUP BY status, reason
        ORDER BY n DESC, status, reason"""
    report = Report()
    for status, reason, n, steps, tokens, cost, priced, sq, cq, eq in client.query(
        rows_sql, parameters=params
    ).result_rows:
        report.rows.append(
            {
                "status": status,
                "reason": reason,
                "runs": int(n),
                "steps": int(steps),
                "tokens": int(tokens),
                "cost_usd": float(cost) if priced else None,
                "p50_steps": _num(sq[0]),
                "p95_steps": _num(sq[1]),
                "p95_cost_usd": _num(cq[1]) if priced else None,
                "p95_elapsed_ms": _num(eq[1]),
            }
        )
    bucket = _bucket(client, database, where, params, since, until, bucket_s)
    series_sql = f"""
        SELECT toUnixTimestamp(toStartOfInterval(minute, INTERVAL {bucket} SECOND)) AS b,
               status, reason, sum(runs), sum(cost_usd_sum), sum(priced_runs)
        FROM {database}.stop_reasons_1m{where}
        GROUP BY b, status, reason
        ORDER BY b, status, reason"""
    for b, status, reason, n, cost, priced in client.query(
        series_sql, parameters=params
    ).result_rows:
        report.series.append(
            {
                "bucket_start_unix": float(b),
                "status": status,
                "reason": reason,
                "runs": int(n),
                "cost_usd": float(cost) if priced else None,
            }
        )
    return report


def _bucket(
    client: Any,
    database: str,
    where: str,
    params: dict,
    since: float | None,
    until: float | None,
    bucket_s: int,
) -> int:
    """Whole minutes (the table's grain), widened so a series has at most MAX_BUCKETS."""
    bucket = max(60, int(bucket_s or 60) // 60 * 60)
    if since is None:
        first = client.query(
            f"SELECT toUnixTimestamp(min(minute)), count() FROM {database}.stop_reasons_1m{where}",
            parameters=params,
        ).result_rows[0]
        if not first[1]:
            return bucket
        since = float(first[0])
    span = (time.time() if until is None else until) - since
    while span / bucket > MAX_BUCKETS:
        bucket *= 2
    return bucket


def report_to_pb(report: Report) -> Any:
    """Report -> ``guard_pb2.ReportResponse`` (None -> NaN)."""
    from guard.v1 import guard_pb2

    def nan(x: Any) -> Any:
        return math.nan if x is None else x

    return guard_pb2.ReportResponse(
        rows=[guard_pb2.DistributionRow(**{k: nan(r[k]) for k in ROW_FIELDS}) for r in report.rows],
        series=[
            guard_pb2.SeriesPoint(**{k: nan(p[k]) for k in SERIES_FIELDS}) for p in report.series
        ],
    )


def report_from_pb(resp: Any) -> Report:
    """``guard_pb2.ReportResponse`` -> Report (NaN -> None)."""

    def val(msg: Any, k: str) -> Any:
        v = getattr(msg, k)
        return None if isinstance(v, float) and math.isnan(v) else v

    return Report(
        rows=[{k: val(r, k) for k in ROW_FIELDS} for r in resp.rows],
        series=[{k: val(p, k) for k in SERIES_FIELDS} for p in resp.series],
    )
