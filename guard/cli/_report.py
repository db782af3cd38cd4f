"""`otel-guard report`: the stop-reason distribution and cost by outcome.

Where the data comes from:

1. ``--clickhouse DSN``: read that store directly (a ClickHouse server, or a ``chdb://`` dir).
2. otherwise ask the running guard (``GuardAdmin.Report`` at ``--endpoint``): the embedded
   engine allows one process per data dir, so while a guard holds it only the guard can read;
3. no guard answers: open the embedded store at ``--data-dir`` directly.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
import sys
import time
from datetime import UTC, datetime
from typing import Any

from guard.cli._client import add_client_arguments, client_from_args

__all__ = ["add_arguments", "parse_time", "render", "run"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_COLUMNS = (
    ("status", "status"),
    ("reason", "reason"),
    ("runs", "runs"),
    ("share", "share"),
    ("steps", "steps"),
    ("tokens", "tokens"),
    ("cost_usd", "cost $"),
    ("p50_steps", "p50 steps"),
    ("p95_steps", "p95 steps"),
    ("p95_cost_usd", "p95 cost $"),
    ("p95_elapsed_ms", "p95 ms"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", help="start: a duration ago (30m, 1h, 7d) or an ISO time")
    parser.add_argument("--until", help="end: a duration ago or an ISO time (default: now)")
    parser.add_argument("--tenant", help="only this tenant")
    parser.add_argument("--agent", help="only this agent")
    parser.add_argument(
        "--bucket", default=None, help="series bucket width (1m, 5m, 1h; default: auto)"
    )
    parser.add_argument("--format", choices=("table", "json", "csv"), default="table")
    parser.add_argument("--json", action="store_true", help="same as --format json")
    parser.add_argument(
        "--chart", metavar="FILE.png", help="also draw stop reasons over time and cost by outcome"
    )
    parser.add_argument(
        "--clickhouse", metavar="DSN", help="read this store directly (chdb://DIR or http(s)://…)"
    )
    parser.add_argument(
        "--data-dir",
        default="./.otel-guard",
        help="embedded store to open when no guard answers (default: ./.otel-guard)",
    )
    add_client_arguments(parser)
    parser.set_defaults(timeout=3.0)  # a missing guard should fall back to the store quickly


def parse_time(text: str | None, *, now: float | None = None) -> float | None:
    """``30m``/``1h``/``7d`` (ago), an ISO time (naive = UTC) or Unix seconds -> Unix seconds."""
    if not text:
        return None
    now = time.time() if now is None else now
    text = text.strip()
    m = _DURATION.match(text)
    if m:
        return now - float(m.group(1)) * _UNITS[m.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not a duration (30m, 1h, 7d) or ISO time: {text!r}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def _bucket_s(text: str | None, since: float | None, until: float | None) -> int:
    if text:
        m = _DURATION.match(text)
        if not m:
            raise ValueError(f"--bucket must look like 1m, 5m or 1h, not {text!r}")
        return max(60, int(float(m.group(1)) * _UNITS[m.group(2)]))
    span = (until or time.time()) - (since if since is not None else time.time() - 86400)
    for b in (60, 300, 900, 3600, 6 * 3600, 86400):  # about 100 bars at most
        if span / b <= 100:
            return b
    return 7 * 86400


def _from_guard(
    args: argparse.Namespace, since: float | None, until: float | None, bucket: int
) -> Any:
    """GuardAdmin.Report; returns None when no guard answers at the endpoint."""
    from guard.errors import GuardError, GuardUnavailable
    from guard.store import report_from_pb

    try:
        with client_from_args(args) as client:
            resp = client.report(
                since=since, until=until, tenant=args.tenant, agent=args.agent, bucket_s=bucket
            )
    except GuardUnavailable:
        return None
    except GuardError as ex:
        raise SystemExit(f"otel-guard report: {ex}") from None
    return report_from_pb(resp)


def _from_store(dsn: str | None, data_dir: str, **query: Any) -> Any:
    from guard.errors import StoreError
    from guard.store import read_report

    try:
        return read_report(dsn, data_dir=data_dir, **query)
    except StoreError as ex:
        raise SystemExit(f"otel-guard report: {ex}") from None


def _fmt(value: Any, key: str) -> str:
    if value is None:
        return "-"
    if key in ("cost_usd", "p95_cost_usd"):
        return f"{value:.4f}" if value < 100 else f"{value:,.2f}"
    if isinstance(value, float):
        return f"{value:.0f}" if math.isfinite(value) else "-"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def render(report: Any, fmt: str, *, meta: dict[str, Any] | None = None) -> str:
    """The report as a terminal table, JSON (rows, series, totals, meta) or CSV (rows)."""
    total = report.total_runs
    rows = [dict(r, share=(r["runs"] / total if total else 0.0)) for r in report.rows]
    if fmt == "json":
        costs = [r["cost_usd"] for r in rows if r["cost_usd"] is not None]
        body = report.to_dict()
        body["total_runs"] = total
        body["total_cost_usd"] = sum(costs) if costs else None
        body["meta"] = meta or {}
        return json.dumps(body, indent=2)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([k for k, _ in _COLUMNS])
        for r in rows:
            writer.writerow(["" if r[k] is None else r[k] for k, _ in _COLUMNS])
        return out.getvalue().rstrip("\n")
    if not rows:
        return "no finished runs in the selected window"
    cells = [[h for _, h in _COLUMNS]]
    for r in rows:
        cells.append([f"{r['share']:.1%}" if k == "share" else _fmt(r[k], k) for k, _ in _COLUMNS])
    costs = [r["cost_usd"] for r in rows if r["cost_usd"] is not None]
    foot = [
        "total",
        "",
        _fmt(total, "runs"),
        "100.0%",
        _fmt(sum(r["steps"] for r in rows), "steps"),
    ]
    foot += [
        _fmt(sum(r["tokens"] for r in rows), "tokens"),
        _fmt(sum(costs) if costs else None, "cost_usd"),
    ]
    cells.append(foot + [""] * (len(_COLUMNS) - len(foot)))
    widths = [max(len(row[i]) for row in cells) for i in range(len(_COLUMNS))]
    lines = []
    for n, row in enumerate(cells):
        if n == len(cells) - 1:
            lines.append("  ".join("-" * w for w in widths))
        # text columns left-aligned, numbers right-aligned
        lines.append(
            "  ".join(
                c.ljust(w) if i < 2 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def run(args: argparse.Namespace) -> int:
    try:
        since = parse_time(args.since)
        until = parse_time(args.until)
        bucket = _bucket_s(args.bucket, since, until)
    except ValueError as ex:
        print(f"otel-guard report: {ex}", file=sys.stderr)
        return 2
    query = {
        "since": since,
        "until": until,
        "tenant": args.tenant,
        "agent": args.agent,
        "bucket_s": bucket,
    }
    source = "clickhouse"
    if args.clickhouse:
        report = _from_store(args.clickhouse, args.data_dir, **query)
    else:
        report = _from_guard(args, since, until, bucket)
        source = f"guard {args.endpoint}"
        if report is None:  # no guard: nobody holds the embedded data dir, read it here
            source = f"store {args.data_dir}"
            report = _from_store(None, args.data_dir, **query)
    fmt = "json" if args.json else args.format
    meta = {
        "source": source,
        "since": since,
        "until": until,
        "tenant": args.tenant,
        "agent": args.agent,
        "bucket_s": bucket,
    }
    print(render(report, fmt, meta=meta))
    if args.chart:
        from guard.store._chart import draw_chart

        draw_chart(report, args.chart, bucket_s=bucket)
        if fmt == "table":
            print(f"chart written to {args.chart}")
    return 0
