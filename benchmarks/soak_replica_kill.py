"""Soak: SIGKILL one of three replicas mid-fleet (or stop Redis), many times.

Each trial starts a fleet (``tests/fleet/_fleet.py``): a real ``redis-server``, three
``otel-guard serve --redis`` replicas each with its own embedded store, and ``--agents`` agent
processes (the real SDK: ``tests/server/_fleet_agent.py``) configured with all three replicas
(``endpoint="r0,r1,r2"``), each running ``--bounded`` runs (``max_steps=30``, stopping only by
max_steps) two at a time plus one idle run. Trial kinds, in turn:

- ``kill``: with runs live, the replica holding the first agent's control stream is
  SIGKILLed, and restarted on its port and data dir (WAL replay) after ``--fast-s`` (even
  trials) or ``--slow-s`` (odd ones);
- ``redis``: every ``--redis-every``-th trial stops Redis (SIGKILL: it comes back empty) for
  ``--redis-down-s`` instead.

Then the bounded runs finish, each tenant's idle run is cancelled, the agents exit (waiting
for every record's acknowledgement), the replicas drain and their stores are read back.

Reported per trial and in total: ``guarded_again_s`` (SIGKILL until every run that was live
on the victim, and still is, is listed connected on a survivor; goal <= 2 s), records lost,
runs with more than one row over the union of the stores (goal 0/0), runs stopped before
their limit (goal 0), and the records the replicas dropped because another replica had
claimed them (``records_claimed_elsewhere``, from their logs).

    .venv/bin/python benchmarks/soak_replica_kill.py [--trials 3] [--agents 3] [--bounded 4]

Prints JSON. About 15 s per trial on a 2-core machine; ``tests/fleet/test_fleet_faults.py``
runs the same events once each in ``make test``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fleet._fleet import Fleet  # tests/fleet holds the fleet harness
from server import _faults as F

_TENANTS = ("acme", "globex", "initech", "umbrella", "hooli", "stark")
_CLAIMED = re.compile(r"store: (\d+) run records are another replica's")


def _claimed_elsewhere(fleet: Fleet) -> int:
    return sum(int(n) for r in fleet.replicas for n in _CLAIMED.findall(r.log()))


def _kill(fleet: Fleet, agents: list[F.FleetAgent], restart_after_s: float) -> dict[str, Any]:
    F.wait_until(lambda: all(len(a.live()) >= 2 for a in agents), 60, "runs live")
    victim, on_victim = fleet.kill_holder(agents[0])
    killed = time.monotonic()
    out: dict[str, Any] = {"kind": "kill", "restart_after_s": restart_after_s}
    try:
        F.wait_until(
            lambda: fleet.guarded_again(victim, on_victim), 30, "guarded", interval_s=0.005
        )
        out["guarded_again_s"] = round(time.monotonic() - killed, 3)
    except AssertionError:
        out["guarded_again_s"] = None
    out["runs_moved"] = len(on_victim)
    time.sleep(max(0.0, restart_after_s - (time.monotonic() - killed)))
    fleet.start(victim)
    return out


def _redis(fleet: Fleet, agents: list[F.FleetAgent], down_s: float) -> dict[str, Any]:
    F.wait_until(lambda: all(len(a.live()) >= 2 for a in agents), 60, "runs live")
    before = sum(len(a.ended()) for a in agents)
    fleet.redis.stop()
    time.sleep(down_s)
    fleet.redis.start()
    return {
        "kind": "redis",
        "redis_down_s": down_s,
        "runs_ended_while_down": sum(len(a.ended()) for a in agents) - before,
    }


def trial(root: Path, kind: str, delay_s: float, agents_n: int, bounded: int) -> dict[str, Any]:
    with Fleet(root, 3) as fleet:
        agents = [
            fleet.agent(_TENANTS[i % len(_TENANTS)], bounded=bounded, idle=1)
            for i in range(agents_n)
        ]
        for a in agents:
            a.go()
        out = (_kill if kind == "kill" else _redis)(fleet, agents, delay_s)
        out.update(fleet.end(bounded))
        out["records_claimed_elsewhere"] = _claimed_elsewhere(fleet)
        out["fail_open_logged"] = sum(
            "unreachable for record claims" in r.log() for r in fleet.replicas
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--agents", type=int, default=3)
    ap.add_argument("--bounded", type=int, default=4, help="bounded runs per agent process")
    ap.add_argument("--fast-s", type=float, default=1.0)
    ap.add_argument("--slow-s", type=float, default=5.0)
    ap.add_argument("--redis-every", type=int, default=3, help="every Nth trial stops Redis")
    ap.add_argument("--redis-down-s", type=float, default=3.0)
    args = ap.parse_args()
    trials = []
    kills = 0
    for i in range(args.trials):
        if args.redis_every and i % args.redis_every == args.redis_every - 1:
            kind, delay = "redis", args.redis_down_s
        else:
            kind, delay = "kill", (args.fast_s if kills % 2 == 0 else args.slow_s)
            kills += 1
        with tempfile.TemporaryDirectory(prefix="soak-replica-kill-") as d:
            t = trial(Path(d), kind, delay, args.agents, args.bounded)
        t["trial"] = i
        trials.append(t)
        print(json.dumps(t), file=sys.stderr, flush=True)
    keys = ("lost", "rows_twice", "rows_unknown", "anonymous", "early_stops")
    keys += ("idle_wrong_reason", "unacknowledged")
    total = {k: sum(t[k] for t in trials) for k in keys}
    times = [t["guarded_again_s"] for t in trials if t["kind"] == "kill"]
    measured = [s for s in times if s is not None]
    summary: dict[str, Any] = {
        "benchmark": "soak_replica_kill",
        "replicas": 3,
        "trials": len(trials),
        "kill_trials": len(times),
        "redis_trials": len(trials) - len(times),
        "runs": sum(t["runs"] for t in trials),
        **total,
        "runs_final_surplus": sum(t["runs_final_surplus"] for t in trials),
        "mv_surplus": sum(t["mv_surplus"] for t in trials),
        "records_claimed_elsewhere": sum(t["records_claimed_elsewhere"] for t in trials),
        "guarded_again_s_p50": round(statistics.median(measured), 3) if measured else None,
        "guarded_again_s_max": max(measured) if measured else None,
        "guarded_again_every_time": len(measured) == len(times),
        "per_trial": trials,
    }
    summary["ok"] = (
        summary["guarded_again_every_time"]
        and (not measured or summary["guarded_again_s_max"] <= 2.0)
        and all(v == 0 for v in total.values())
        and summary["mv_surplus"] == 0
        and summary["runs_final_surplus"] == 0
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
