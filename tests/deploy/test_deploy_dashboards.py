"""Every panel and variable query of dashboards/*.json runs on the real embedded ClickHouse.

The store is opened with ``guard.store.open_store`` on a temporary directory, so the
project's own migrations create the schema the dashboards read; it is seeded through the
store's RecordSink (runs of every status and reason, and decisions of every action), then each
query is expanded the way the grafana-clickhouse-datasource plugin expands it and executed.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
import yaml
from _deploy_grafana import ALL, TimeRange, Variable, expand

from guard.policy._types import REASON_STATUS, DecidedBy, Outcome, Reason, Status
from guard.store import DecisionRecord, open_store

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))
DATASOURCE_TYPE = "grafana-clickhouse-datasource"
TENANTS = ("acme", "globex", "o'hara")  # a quote in a value exercises the variable escaping
AGENTS = ("refund-bot", "research", "coder")
ACTIONS = ("warn", "wrap_up", "cancel", "deny")


def _outcomes(now: float) -> list[Outcome]:
    rng = random.Random(7)
    out = []
    i = 0
    # Every reason (hence every status) for every tenant, plus a block of completed runs with
    # a spread of step counts so every step bucket has runs.
    plan = [(r, REASON_STATUS[r]) for r in Reason] * 2 + [
        (Reason.FINAL_ANSWER, Status.COMPLETED)
    ] * 30
    plan.append((Reason.MISSING_EVIDENCE, Status.COMPLETED))  # a caller-chosen status
    for tenant in TENANTS:
        for reason, status in plan:
            i += 1
            steps = (
                rng.choice((0, 1, 2, 3, 5, 8, 10, 14, 25))
                if reason is not Reason.TENANT_BUDGET
                else 0
            )
            ended = now - rng.uniform(30, 3000)
            elapsed_ms = rng.randint(200, 120_000)
            out.append(
                Outcome(
                    run_id=f"run-{i:05d}",
                    status=status,
                    reason=reason,
                    message=f"{reason.value} after {steps} steps",
                    parent_run_id=f"run-{i - 1:05d}" if i % 9 == 0 else None,
                    tenant=tenant,
                    agent=AGENTS[i % len(AGENTS)],
                    trace_id=f"{i:032x}",
                    steps=steps,
                    model_calls=steps,
                    tool_calls=steps * 2,
                    tool_attempts=steps * 2 + (i % 3),
                    input_tokens=1000 * steps + 500 * steps * steps,
                    output_tokens=120 * steps,
                    reasoning_tokens=30 * steps,
                    cached_tokens=200 * steps,
                    # Some unpriced runs: cost stays NULL, never 0.
                    cost_usd=None if i % 7 == 0 else round(0.002 * steps * steps + 0.001, 6),
                    elapsed_ms=elapsed_ms,
                    deadline_ms=None if i % 4 == 0 else 300_000,
                    last_tool=rng.choice(("search", "fetch", "sql", None)),
                    last_action_hash=f"{i:032x}",
                    loop_hits=rng.randint(1, 4)
                    if reason in (Reason.LOOP_DETECTED, Reason.NO_PROGRESS)
                    else i % 2,
                    partial_result=status is not Status.COMPLETED and i % 2 == 0,
                    recoverable=reason in (Reason.DEADLINE, Reason.AGENT_LOST),
                    decided_by=DecidedBy.GUARD if i % 3 == 0 else DecidedBy.SDK,
                    price_book_version="2026-11",
                    started_at=ended - elapsed_ms / 1000,
                    ended_at=ended,
                )
            )
    return out


def _decisions(now: float) -> list[DecisionRecord]:
    rng = random.Random(11)
    out = []
    for n in range(240):
        action = ACTIONS[n % len(ACTIONS)]
        reason = rng.choice(
            (
                Reason.COST_BUDGET,
                Reason.TOKEN_BUDGET,
                Reason.LOOP_DETECTED,
                Reason.TENANT_BUDGET,
                Reason.OPERATOR_CANCEL,
            )
        )
        acked = action != "deny" and n % 5 != 0
        out.append(
            DecisionRecord(
                decided_at=now - rng.uniform(30, 3000),
                run_id=f"run-{n:05d}",
                tenant=TENANTS[n % len(TENANTS)],
                agent=AGENTS[n % len(AGENTS)],
                action=action,
                reason=reason.value,
                detail=f"{reason.value} at step {n % 12}",
                utilisation=None if n % 10 == 0 else rng.uniform(0.5, 1.2),
                metric=None if n % 10 == 0 else rng.choice(("cost_usd", "tokens", "steps")),
                command_id=n + 1,
                decided_by="operator" if reason is Reason.OPERATOR_CANCEL else "guard",
                delivery_latency_ms=rng.uniform(0.5, 40.0) if acked else None,
                guard_id=f"guard-{n % 2}",
            )
        )
    return out


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    now = time.time()
    store = open_store(None, data_dir=tmp_path_factory.mktemp("store"), retention_days=None)
    try:
        runs = _outcomes(now)
        for o in runs:
            store.write_run(o)
        decisions = _decisions(now)
        for d in decisions:
            store.write_decision(d)
        assert store.flush(timeout_s=60), store.counters()
        yield store, now, runs, decisions
    finally:
        store.close()


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _panels(board: dict):
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])  # collapsed rows keep their panels inside


def _targets(board: dict):
    for panel in _panels(board):
        for target in panel.get("targets", []):
            yield panel, target


def _query_vars(board: dict) -> list[dict]:
    return [v for v in board["templating"]["list"] if v["type"] == "query"]


def _time_range(now: float) -> TimeRange:
    return TimeRange(from_s=int(now) - 3600, to_s=int(now) + 60, interval_s=60)


def _resolve_variables(store, board: dict, tr: TimeRange, choose: dict[str, list[str]]):
    """Run the variable queries in dashboard order, like Grafana does, and pick values."""
    resolved: list[Variable] = []
    for var in _query_vars(board):
        sql = expand(var["query"]["rawSql"], resolved, tr)
        options = [str(row[0]) for row in store.query(sql)]
        assert options, f"variable {var['name']} has no options: {sql}"
        if var["name"] == "database":
            value = ["otel_guard"]
        else:
            value = choose.get(var["name"], [ALL])
            assert value == [ALL] or set(value) <= set(options), (var["name"], value, options)
        resolved.append(Variable(var["name"], value, options))
    return resolved


SCENARIOS = {
    "all": {},
    "one-tenant": {"tenant": ["acme"]},
    "quoted-tenant-and-agent": {"tenant": ["o'hara", "globex"], "agent": ["research"]},
}


def test_dashboards_exist_and_use_the_plugin():
    names = {p.name for p in DASHBOARDS}
    assert {"otel-guard-stop-reasons.json", "otel-guard-decisions.json"} <= names
    for path in DASHBOARDS:
        board = _load(path)
        uids = [p["id"] for p in _panels(board)]
        assert len(uids) == len(set(uids)), f"{path.name}: duplicate panel ids"
        assert {v["name"] for v in _query_vars(board)} >= {"tenant", "agent"}
        for var in _query_vars(board):
            if var["name"] in ("tenant", "agent"):
                assert var["multi"] and var["includeAll"], var["name"]
        for panel, target in _targets(board):
            assert panel["datasource"]["type"] == DATASOURCE_TYPE, panel["title"]
            assert target["datasource"]["type"] == DATASOURCE_TYPE, panel["title"]
            assert target["editorType"] == "sql" and target["rawSql"].strip(), panel["title"]
            # Time-series panels read a time column; tables and stats take the table format.
            assert target["format"] == (0 if panel["type"] == "timeseries" else 1), panel["title"]
            sql = target["rawSql"]
            assert "$__timeFilter(" in sql, f"{panel['title']}: no time filter"
            assert "$__conditionalAll(tenant IN (${tenant:singlequote}), $tenant)" in sql
            assert "$__conditionalAll(agent IN (${agent:singlequote}), $agent)" in sql


def test_layout_and_links():
    boards = [_load(p) for p in DASHBOARDS]
    uids = {b["uid"] for b in boards}
    assert len(uids) == len(boards), "dashboard uids must be unique"
    for board in boards:
        for link in board.get("links", []):
            if link.get("url", "").startswith("/d/"):
                assert link["url"][3:].split("?")[0] in uids, link
        cells: set[tuple[int, int]] = set()
        for panel in _panels(board):
            g = panel["gridPos"]
            assert g["x"] >= 0 and g["x"] + g["w"] <= 24, panel["title"]
            mine = {
                (x, y)
                for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])
            }
            assert not cells & mine, f"{board['uid']}: {panel['title']} overlaps another panel"
            cells |= mine


def test_required_panels_are_present():
    titles = " | ".join(p.get("title", "") for path in DASHBOARDS for p in _panels(_load(path)))
    for needed in (
        "Stop reasons over time",
        "Share of each stop reason",
        "Success rate by step count",
        "Cost and tokens by outcome",
        "Quantiles of steps, cost and elapsed time",
        "Loop-detector hits",
        "Delivery latency",
        "Top tenants by spend",
        "Budget utilisation by tenant",
        "Recent stopped runs",
    ):
        assert needed in titles, needed
    stacked = [
        p
        for path in DASHBOARDS
        for p in _panels(_load(path))
        if p.get("title") == "Stop reasons over time"
    ]
    assert stacked[0]["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_every_panel_query_runs(seeded, path, scenario):
    store, now, _runs, _decisions = seeded
    board = _load(path)
    tr = _time_range(now)
    variables = _resolve_variables(store, board, tr, SCENARIOS[scenario])
    ran = 0
    for panel, target in _targets(board):
        sql = expand(target["rawSql"], variables, tr)
        rows = store.query(sql)
        # The seed covers every tenant, agent, status, reason and action, so every panel has
        # data in every scenario.
        assert rows, f"{path.name} / {panel['title']} [{scenario}] returned no rows:\n{sql}"
        ran += 1
    assert ran >= 8


def _panel_rows(store, board, title, tr, choose=None):
    variables = _resolve_variables(store, board, tr, choose or {})
    (target,) = [t for p, t in _targets(board) if p["title"] == title]
    return store.query(expand(target["rawSql"], variables, tr))


def test_panel_values_match_the_seed(seeded):
    store, now, runs, decisions = seeded
    tr = _time_range(now)
    stop = _load(REPO / "dashboards" / "otel-guard-stop-reasons.json")

    assert _panel_rows(store, stop, "Runs ended", tr) == [(len(runs),)]
    share = dict(_panel_rows(store, stop, "Share of each stop reason", tr))
    assert set(share) == {r.value for r in Reason}
    assert sum(share.values()) == len(runs)

    buckets = {
        b: (rate, n) for b, rate, n in _panel_rows(store, stop, "Success rate by step count", tr)
    }
    assert set(buckets) == {"0", "1-2", "3-5", "6-10", "11+"}
    assert sum(n for _, n in buckets.values()) == len(runs)
    assert all(0.0 <= rate <= 1.0 for rate, _ in buckets.values())

    by_status = {row[0]: row for row in _panel_rows(store, stop, "Cost and tokens by outcome", tr)}
    assert set(by_status) == {s.value for s in Status}
    expected_cost = sum(o.cost_usd or 0 for o in runs if o.status is Status.FAILED)
    assert by_status["failed"][2] == pytest.approx(expected_cost)

    recent = _panel_rows(store, stop, "Recent stopped runs", tr, {"tenant": ["acme"]})
    assert recent and all(row[1] != "completed" and row[3] == "acme" for row in recent)

    dec = _load(REPO / "dashboards" / "otel-guard-decisions.json")
    assert _panel_rows(store, dec, "Decisions", tr) == [(len(decisions),)]
    by_action = {
        (a, r): n for a, r, n, *_ in _panel_rows(store, dec, "Decisions by action and reason", tr)
    }
    assert set(a for a, _ in by_action) == set(ACTIONS)
    assert sum(by_action.values()) == len(decisions)


def test_provisioning_files():
    prov = REPO / "dashboards" / "provisioning"
    ds = yaml.safe_load((prov / "datasources" / "clickhouse.yaml").read_text())
    (source,) = ds["datasources"]
    assert source["type"] == DATASOURCE_TYPE
    assert source["jsonData"]["defaultDatabase"] == "otel_guard"
    assert "password" in source["secureJsonData"], "the password stays in secureJsonData"
    boards = yaml.safe_load((prov / "dashboards" / "otel-guard.yaml").read_text())
    (provider,) = boards["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]
    # The dashboards pick the data source through their variable, so provisioning by uid or
    # by default both work.
    for path in DASHBOARDS:
        variable = next(v for v in _load(path)["templating"]["list"] if v["name"] == "datasource")
        assert variable["type"] == "datasource" and variable["query"] == DATASOURCE_TYPE
