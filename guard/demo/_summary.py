"""The demo's verdict: agent-observed outcomes against the distribution read from ClickHouse."""

from __future__ import annotations

from collections import Counter
from typing import Any

from guard.demo._fleet import STAGED_REASONS
from guard.demo._live import Live, fmt_usd

__all__ = ["compare", "compare_runs", "print_summary"]


def compare_runs(
    outcomes: list[dict[str, Any]], stored: dict[str, dict[str, str]]
) -> list[dict[str, Any]]:
    """Run for run: each outcome an agent observed against its row in ``otel_guard.runs``."""
    bad = []
    for o in outcomes:
        seen = o["outcome"]
        row = stored.get(seen.get("run_id", ""))
        keys = ("status", "reason", "decided_by")
        if row is None or any(str(seen.get(k)) != row[k] for k in keys):
            bad.append({"run_id": seen.get("run_id"), "agents": {k: seen.get(k) for k in keys},
                        "clickhouse": row})  # fmt: skip
    return bad


def compare(outcomes: list[dict[str, Any]], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Check every staged reason occurred, and that ClickHouse counts what the agents saw.

    Returns ``observed`` ((status, reason) -> runs as the agents saw them), ``staged`` (reason ->
    agents/clickhouse counts), ``missing`` (staged reasons absent on either side) and
    ``mismatched`` ((status, reason) pairs whose counts differ).
    """
    observed = Counter((o["outcome"].get("status"), o["outcome"].get("reason")) for o in outcomes)
    stored: Counter[tuple[str, str]] = Counter()
    for row in rows:
        stored[(row["status"], row["reason"])] += int(row["runs"])
    by_reason_agents: Counter[str] = Counter()
    by_reason_store: Counter[str] = Counter()
    for (_, reason), n in observed.items():
        by_reason_agents[reason] += n
    for (_, reason), n in stored.items():
        by_reason_store[reason] += n
    staged = {
        r: {"agents": by_reason_agents.get(r, 0), "clickhouse": by_reason_store.get(r, 0)}
        for r in STAGED_REASONS
    }
    missing = [r for r, c in staged.items() if not c["agents"] or not c["clickhouse"]]
    mismatched = [
        {"status": s, "reason": r, "agents": observed.get((s, r), 0), "clickhouse": stored[(s, r)]}
        for (s, r) in sorted(set(observed) | set(stored))
        if observed.get((s, r), 0) != stored.get((s, r), 0)
    ]
    unexpected = [
        {"kind": o["kind"], "expect": o["expect"], "reason": o["outcome"].get("reason")}
        for o in outcomes
        if o["outcome"].get("reason") != o["expect"]
    ]
    return {
        "observed": [
            {"status": s, "reason": r, "runs": n} for (s, r), n in sorted(observed.items())
        ],
        "staged": staged,
        "missing": missing,
        "mismatched": mismatched,
        "unexpected": unexpected,
    }


def print_summary(live: Live, rows: list[dict[str, Any]], verdict: dict[str, Any]) -> None:
    """The closing table: the distribution from ClickHouse beside what the agents saw."""
    agents = {(o["status"], o["reason"]): o["runs"] for o in verdict["observed"]}
    total = sum(int(r["runs"]) for r in rows)
    live.line("", stamp=False)
    live.line(
        live.style(f"Stop reasons read back from ClickHouse (otel_guard, {total} runs)", "bold"),
        stamp=False,
    )
    head = (
        f"  {'status':<11}{'reason':<17}{'runs':>5}{'steps':>7}{'tokens':>10}"
        f"{'cost':>10}{'p95 steps':>11}   agents saw"
    )
    live.line(live.style(head, "dim"), stamp=False)
    for row in sorted(rows, key=lambda r: (-int(r["runs"]), r["status"], r["reason"])):
        seen = agents.get((row["status"], row["reason"]), 0)
        ok = seen == int(row["runs"])
        mark = live.style("✓", "green") if ok else live.style("✗", "red")
        live.line(
            f"  {row['status']:<11}{row['reason']:<17}{int(row['runs']):>5}"
            f"{int(row.get('steps', 0)):>7}{int(row.get('tokens', 0)):>10,}"
            f"{fmt_usd(row.get('cost_usd')):>10}{float(row.get('p95_steps') or 0):>11.0f}"
            f"   {seen:>4} {mark}",
            stamp=False,
        )
    for m in verdict["mismatched"]:
        if (m["status"], m["reason"]) not in {(r["status"], r["reason"]) for r in rows}:
            live.line(
                live.style(
                    f"  {m['status']:<11}{m['reason']:<17}{0:>5}  (agents saw {m['agents']}) ✗",
                    "red",
                ),
                stamp=False,
            )
    live.line("", stamp=False)
    staged = verdict["staged"]
    seen_both = [r for r in staged if r not in verdict["missing"]]
    line = f"Staged stop reasons: {len(seen_both)}/{len(staged)} occurred: " + ", ".join(
        live.style(r, "green") if r in seen_both else live.style(f"{r} (MISSING)", "red")
        for r in staged
    )
    live.line(line, stamp=False)
    if verdict["mismatched"]:
        live.line(
            live.style(
                f"The distribution differs from what the agents saw on "
                f"{len(verdict['mismatched'])} status/reason pairs (see above)",
                "red" if verdict["fresh_store"] else "yellow",
            ),
            stamp=False,
        )
        if not verdict["fresh_store"]:
            live.line(
                "  (the data dir held earlier runs: the per-minute table includes them)",
                stamp=False,
            )
    bad = verdict["run_mismatches"]
    if bad:
        live.line(
            live.style(f"{len(bad)} runs are missing from otel_guard.runs or differ:", "red"),
            stamp=False,
        )
        for b in bad[:10]:
            live.line(f"  {b['run_id']}: agents {b['agents']} clickhouse {b['clickhouse']}",
                      stamp=False)  # fmt: skip
    else:
        live.line(
            live.style(
                f"ClickHouse matches what every agent observed, run for run "
                f"({verdict['runs_checked']} runs: status, reason, decided_by) ✓",
                "green",
            ),
            stamp=False,
        )
