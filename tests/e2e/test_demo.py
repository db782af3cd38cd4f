"""`otel-guard demo --quick --json` end to end: every staged stop reason occurs, and the
distribution read back from ClickHouse matches, run for run, what the agents observed
(this is also the issue-5 end-to-end check: agent outcomes -> guard -> ClickHouse)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from guard.demo import STAGED_REASONS, build_fleet

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("demo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_GUARD_")}
    proc = subprocess.run(
        [sys.executable, "-m", "guard.cli", "demo", "--quick", "--json",
         "--data-dir", str(work / "data")],
        capture_output=True, text=True, timeout=240, env=env, cwd=work,
    )  # fmt: skip
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-6000:]}"
    data = json.loads(proc.stdout)
    data["_stderr"] = proc.stderr
    return data


@pytest.mark.timeout(300)
def test_every_staged_reason_seen_by_agents_and_clickhouse(summary: dict) -> None:
    agents = Counter(r["outcome"]["reason"] for r in summary["runs"])
    stored: Counter[str] = Counter()
    for row in summary["distribution"]:
        stored[row["reason"]] += int(row["runs"])
    for reason in STAGED_REASONS:
        assert agents[reason] > 0, f"no agent observed {reason}: {dict(agents)}"
        assert stored[reason] > 0, f"ClickHouse has no {reason}: {dict(stored)}"
    assert summary["ok"] is True and summary["missing"] == []


@pytest.mark.timeout(300)
def test_clickhouse_counts_match_agent_outcomes(summary: dict) -> None:
    observed = Counter((r["outcome"]["status"], r["outcome"]["reason"]) for r in summary["runs"])
    stored = Counter()
    for row in summary["distribution"]:
        stored[(row["status"], row["reason"])] += int(row["runs"])
    assert stored == observed
    planned = sum(p.runs for p in build_fleet(quick=True))
    assert len(summary["runs"]) == planned == sum(stored.values())
    assert summary["mismatched"] == [] and summary["errors"] == []
    # Run for run: each agent's outcome is the row in otel_guard.runs (status, reason, by).
    assert summary["run_mismatches"] == [] and summary["runs_checked"] == planned


@pytest.mark.timeout(300)
def test_each_runaway_stopped_for_its_own_reason(summary: dict) -> None:
    for run in summary["runs"]:
        outcome = run["outcome"]
        assert outcome["reason"] == run["expect"], run
        assert outcome["run_id"], run
    by_kind: dict[str, list[dict]] = {}
    for run in summary["runs"]:
        by_kind.setdefault(run["kind"], []).append(run["outcome"])
    # Fleet-level stops come from the guard and the operator, not from the agent's own limits.
    assert all(o["decided_by"] == "operator" for o in by_kind["long_support"])
    assert all(o["status"] == "cancelled" for o in by_kind["long_support"])
    assert all(o["decided_by"] == "guard" for o in by_kind["budget_spender"])
    # Denied runs never started a step.
    assert all(o["steps"] == 0 for o in by_kind["budget_denied"])
    # The budget was shared by two processes of the tenant.
    spenders = [r for r in summary["runs"] if r["kind"] == "budget_spender"]
    assert {r["process"] for r in spenders} == {"umbrella-1", "umbrella-2"}
    assert len(summary["operator_cancel"]["run_ids"]) >= 2


@pytest.mark.timeout(300)
def test_demo_output_and_artifacts(summary: dict) -> None:
    assert Path(summary["data_dir"], "clickhouse").exists()
    assert summary["processes"] and all(p["exit_code"] == 0 for p in summary["processes"])
    assert len({p["pid"] for p in summary["processes"]}) == len(summary["processes"]) >= 4
    # The live view (stderr in --json mode) showed the decisions and the read-back table.
    err = summary["_stderr"]
    assert "GuardAdmin.Cancel" in err
    assert "Stop reasons read back from ClickHouse" in err
    if summary["chart"]:
        assert Path(summary["chart"]).stat().st_size > 0
