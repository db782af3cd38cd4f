"""`otel-guard runs`: the live runs with their budget use (GuardAdmin.ListRuns)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from guard.cli._client import add_client_arguments

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenant", default="", help="only this tenant's runs")
    parser.add_argument("--agent", default="", help="only this agent's runs")
    parser.add_argument("--limit", type=int, default=0, help="at most N runs (0 = server default)")
    parser.add_argument("--budgets", action="store_true", help="also show tenant rolling budgets")
    parser.add_argument(
        "--local",
        action="store_true",
        help="with replicas: only the runs whose streams the replica at --endpoint holds",
    )
    add_client_arguments(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _run_dict(r: Any) -> dict[str, Any]:
    u = r.usage
    return {
        "run_id": r.run_id,
        "parent_run_id": r.parent_run_id or None,
        "tenant": r.tenant,
        "agent": r.agent,
        "process_id": r.process_id,
        "state": r.state,
        "connected": r.connected,
        "guard_id": r.guard_id or None,  # the replica holding its stream (with replicas)
        "elapsed_s": round(r.elapsed_s, 3),
        "steps": u.steps,
        "model_calls": u.model_calls,
        "tool_calls": u.tool_calls,
        "tokens": u.input_tokens + u.output_tokens,
        "cost_usd": u.cost_usd if u.HasField("cost_usd") else None,
        "utilisation": round(r.utilisation, 4),
        "metric": r.metric or None,
        "max_steps": r.limits.max_steps if r.limits.HasField("max_steps") else None,
        "max_cost_usd": r.limits.max_cost_usd if r.limits.HasField("max_cost_usd") else None,
        "max_tokens": r.limits.max_tokens if r.limits.HasField("max_tokens") else None,
    }


def _budget_dict(t: Any) -> dict[str, Any]:
    return {
        "tenant": t.tenant,
        "live_runs": t.live_runs,
        "max_concurrent_runs": (
            t.max_concurrent_runs if t.HasField("max_concurrent_runs") else None
        ),
        "exhausted": t.exhausted,
        "windows": [
            {"metric": w.metric, "window_s": w.window_s, "used": w.used, "limit": w.limit}
            for w in t.windows
        ],
    }


def _table(runs: list[dict[str, Any]], total: int) -> str:
    head = (
        f"{'RUN':<24} {'TENANT':<12} {'AGENT':<16} {'STATE':<9} {'STEPS':>5} "
        f"{'TOKENS':>8} {'COST$':>8} {'USE':>6} METRIC"
    )
    lines = [head]
    for r in runs:
        cost = "-" if r["cost_usd"] is None else f"{r['cost_usd']:.4f}"
        lines.append(
            f"{r['run_id'][:24]:<24} {r['tenant'][:12]:<12} {r['agent'][:16]:<16} "
            f"{r['state']:<9} {r['steps']:>5} {r['tokens']:>8} {cost:>8} "
            f"{r['utilisation'] * 100:>5.0f}% {r['metric'] or ''}"
        )
    lines.append(f"{len(runs)} of {total} live run(s)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from guard.cli._client import client_from_args
    from guard.errors import GuardError

    try:
        with client_from_args(args) as client:
            resp = client.list_runs(
                tenant=args.tenant, agent=args.agent, limit=args.limit, local=args.local
            )
            partial = client.partial  # before the budgets call replaces it
            budgets = client.tenant_budgets(args.tenant).tenants if args.budgets else []
    except GuardError as exc:
        print(f"otel-guard runs: {exc}", file=sys.stderr)
        return 1
    runs = [_run_dict(r) for r in resp.runs]
    if partial:
        print(f"otel-guard runs: partial answer ({partial})", file=sys.stderr)
    if args.json:
        out: dict[str, Any] = {"runs": runs, "total": resp.total, "partial": partial}
        if args.budgets:
            out["tenants"] = [_budget_dict(t) for t in budgets]
        print(json.dumps(out))
        return 0
    print(_table(runs, resp.total))
    for t in budgets:
        d = _budget_dict(t)
        flag = " EXHAUSTED" if d["exhausted"] else ""
        print(f"tenant {d['tenant']}: {d['live_runs']} live{flag}")
        for w in d["windows"]:
            print(f"  {w['metric']} {w['used']:.4g}/{w['limit']:.4g} per {w['window_s']:g}s")
    return 0
