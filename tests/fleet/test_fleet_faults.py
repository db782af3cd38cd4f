"""Three replicas in their own processes, real-SDK agents with endpoint lists, real Redis:
a replica SIGKILLed mid-fleet, a run's spans and its stream on different replicas, Redis
stopped and restarted. Over the union of the replicas' stores every run has one row."""

from __future__ import annotations

from pathlib import Path

import pytest
from server import _faults as F

from fleet._fleet import Fleet

pytestmark = pytest.mark.slow

_TENANTS = ("acme", "globex", "initech")


def _clean(t: dict) -> None:
    bad = ("lost", "rows_twice", "rows_unknown", "anonymous", "early_stops", "idle_wrong_reason")
    assert all(t[k] == 0 for k in bad), t
    assert t["runs_final_surplus"] == 0 and t["mv_surplus"] == 0, t
    assert t["unacknowledged"] == 0, t


def test_replica_sigkilled_mid_fleet(tmp_path: Path) -> None:
    with Fleet(tmp_path, 3) as fleet:
        agents = [fleet.agent(t, bounded=4, idle=1) for t in _TENANTS]
        for a in agents:
            a.go()
        F.wait_until(lambda: all(len(a.live()) >= 2 for a in agents), 30, "runs live")
        victim, on_victim = fleet.kill_holder(agents[0])
        F.wait_until(  # connected on a survivor, as its ListRuns shows them
            lambda: fleet.guarded_again(victim, on_victim),
            15,
            "runs guarded again",
            interval_s=0.01,
        )
        fleet.start(victim)  # same data dir: replays its WAL, claims what it holds
        t = fleet.end(bounded=4)
    _clean(t)
    assert on_victim and t["runs"] == 3 * 5


def test_spans_on_one_replica_stream_on_another(tmp_path: Path) -> None:
    """Trace-ID routing: a run's spans reach r0, its control stream r1. r1 writes the agent's
    record; r0 finds the run in the run directory, guards it as a remote run and writes no
    record of it at all (before the directory, r0 recorded it from its spans once its grace
    had passed, and only the store's claim kept that second record out of ClickHouse)."""
    with Fleet(tmp_path, 2, grace_s=1.0) as fleet:
        agent = fleet.agent(
            "acme", bounded=3, endpoint=fleet.endpoint(1), span_endpoint=fleet.endpoint(0)
        )
        agent.go()
        F.wait_until(lambda: len(agent.ended()) >= 3, 60, "bounded runs")
        done = agent.finish(60)["stats"]  # its spans flushed, its records acknowledged
        assert done.get("control_records_unacknowledged", 0) == 0, done
        F.wait_until(  # r0 saw the spans, guarded the runs as remote ones and forgot them
            lambda: (f := fleet.figures(0))["spans"] > 0 and f["runs_tracked"] == 0,
            20,
            "r0 forgets the ended remote runs",
        )
        r0 = fleet.figures(0)
        # r0 guarded the runs it found held by r1 as remote runs; a run whose spans reached it
        # only after the run had ended on r1 (a loaded machine) met the directory's tombstone
        # and was never tracked. Either way r0 never recorded one as lost.
        assert r0.get("remote_runs", 0) >= 1 and r0.get("agent_lost", 0) == 0, r0
        verdict = fleet.verdict()
    t = F.tally([agent], verdict, idle_reason="operator_cancel")
    t["unacknowledged"] = 0
    _clean(t)
    assert verdict["by_replica"] == {"r0": 0, "r1": 3}, verdict["by_replica"]
    assert "another replica's; not stored here" not in fleet.replicas[0].log()  # no 2nd record


def test_redis_stopped_and_restarted_mid_fleet(tmp_path: Path) -> None:
    """Robustness: with Redis gone for a while (and back empty) runs keep running and end at
    their limits, records flow (claims fail open, logged once, claimed when Redis is back),
    and every run has one row. Nothing here doubles without the claims either (no record
    moves between replicas), so this holds on the code before them too, but for the logs."""
    with Fleet(tmp_path, 3) as fleet:
        agents = [fleet.agent(t, bounded=5, idle=1) for t in _TENANTS]
        for a in agents:
            a.go()
        F.wait_until(lambda: sum(len(a.ended()) for a in agents) >= 3, 60, "first ends")
        fleet.redis.stop()
        ended = {a.tenant: len(a.ended()) for a in agents}
        F.wait_until(  # runs end while Redis is away, and their records are stored unclaimed
            lambda: (
                all(len(a.ended()) > ended[a.tenant] for a in agents)
                and any("unreachable for record claims" in r.log() for r in fleet.replicas)
            ),
            30,
            "runs ending without Redis",
        )
        fleet.redis.start()
        down = [r for r in fleet.replicas if "unreachable for record claims" in r.log()]
        F.wait_until(
            lambda: all("reachable again for record claims" in r.log() for r in down),
            30,
            "claims back",
        )
        t = fleet.end(bounded=5)
    _clean(t)
    for r in down:
        assert r.log().count("unreachable for record claims") == 1, r.name


def test_cli_says_which_replica_did_not_answer(tmp_path: Path) -> None:
    """A fleet query through a survivor while a SIGKILLed replica is still in the replica set
    (its heartbeat has not lapsed): the CLI answers with what it has and names the replica
    that did not answer, on stderr and in --json."""
    import json
    import subprocess
    import sys

    with Fleet(tmp_path, 2) as fleet:
        fleet.kill(1)
        cmd = [sys.executable, "-m", "guard.cli", "runs", "--json"]
        out = subprocess.run(
            [*cmd, "--endpoint", fleet.replicas[0].address],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        assert "r1" in json.loads(out.stdout)["partial"]
        assert "partial answer" in out.stderr and "r1" in out.stderr
        local = subprocess.run(
            [*cmd, "--local", "--endpoint", fleet.replicas[0].address],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert json.loads(local.stdout)["partial"] is None  # no fleet query, nothing missing
