"""Soak: SIGKILL the guard mid-fleet and restart it on the same port and data dir, many times.

Each trial starts a guard (``otel-guard serve``, embedded store in a fresh data dir) and a
fleet of agent processes (the real SDK: ``tests/server/_fleet_agent.py``), each running
bounded runs (``max_steps=30``, stopping only by max_steps) two at a time plus one idle run.
Mid-fleet the guard is SIGKILLed and restarted after ``--fast-s`` (half the trials) or
``--slow-s`` (the other half). The trial then waits until every run still live in its agent
is listed again (with its tenant and agent), lets the bounded runs finish, cancels each
tenant's idle run with ``otel-guard cancel --tenant``, stops the guard (SIGTERM) and reads
the store back.

Reported per trial and in total: records lost, runs with more than one row in ``runs``
(FINAL, by run id), the surplus of ``stop_reasons_1m`` over the runs (a run counted twice),
rows without tenant or agent, early stops (a bounded run ending other than max_steps at 30
steps), whether every live run was listed again, and the time from the restarted guard being
ready to the last live run listed.

    .venv/bin/python benchmarks/soak_guard_kill.py [--trials 20] [--agents 4] [--bounded 10]

Prints JSON. Takes about 15 s per trial on a 2-core machine, so it is not part of
``run_all.py``; ``tests/server/test_faults.py`` keeps a bounded run of it in ``make test``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "server"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # _wait, for _faults
import _faults as F  # tests/server holds the real-process harness

_TENANTS = ("acme", "globex", "initech", "umbrella", "hooli", "stark")


def trial(root: Path, restart_after_s: float, agents_n: int, bounded: int) -> dict:
    guard = F.GuardProc(F.free_port(), root / "guard").start()
    tenants = [_TENANTS[i % len(_TENANTS)] for i in range(agents_n)]
    agents = [F.FleetAgent(guard.address, t, bounded=bounded, idle=1) for t in tenants]
    out: dict = {"restart_after_s": restart_after_s}
    with F.running(guard, agents):
        for a in agents:
            a.go()
        # mid-fleet: every idle run and some bounded runs live, some bounded runs already over
        F.wait_until(lambda: sum(len(a.ended()) for a in agents) >= agents_n, 60, "first ends")
        guard.kill()
        killed = time.monotonic()
        time.sleep(restart_after_s)
        guard.start()
        ready = time.monotonic()
        out["down_s"] = round(ready - killed, 3)

        def relisted() -> bool:
            want = set().union(*(a.live() for a in agents))
            seen = F.listed(guard.address)
            return want <= set(seen) and all(seen[r].tenant and seen[r].agent for r in want)

        try:
            F.wait_until(relisted, 20, "live runs listed again", interval_s=0.01)
            out["relisted"] = True
            out["ready_to_listed_s"] = round(time.monotonic() - ready, 3)
        except AssertionError:
            out["relisted"] = False
        ended = F.end_fleet(guard.address, agents, bounded)
        out["idle_cancelled"] = sum(len(ids) for ids in ended["cancelled"].values())
        out["idle_runs"] = agents_n
        out["sdk_undelivered"] = ended["undelivered"]
    verdict = F.store_verdict(guard.data_dir)
    out.update(F.tally(agents, verdict, idle_reason="operator_cancel"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--bounded", type=int, default=10, help="bounded runs per agent process")
    ap.add_argument("--fast-s", type=float, default=1.0)
    ap.add_argument("--slow-s", type=float, default=5.0)
    args = ap.parse_args()
    trials = []
    for i in range(args.trials):
        delay = args.fast_s if i % 2 == 0 else args.slow_s
        with tempfile.TemporaryDirectory(prefix="soak-guard-kill-") as d:
            t = trial(Path(d), delay, args.agents, args.bounded)
        t["trial"] = i
        trials.append(t)
        print(json.dumps(t), file=sys.stderr, flush=True)
    keys = ("lost", "rows_twice", "rows_unknown", "anonymous", "early_stops")
    keys += ("idle_wrong_reason", "sdk_undelivered")
    total = {k: sum(t[k] for t in trials) for k in keys}
    listed_s = [t["ready_to_listed_s"] for t in trials if t.get("relisted")]
    summary = {
        "benchmark": "soak_guard_kill",
        "trials": len(trials),
        "runs": sum(t["runs"] for t in trials),
        **total,
        "runs_final_surplus": sum(t["runs_final_surplus"] for t in trials),
        "mv_surplus": sum(t["mv_surplus"] for t in trials),
        "relisted_every_time": all(t.get("relisted") for t in trials),
        "ready_to_listed_s_p50": round(statistics.median(listed_s), 3) if listed_s else None,
        "ready_to_listed_s_max": max(listed_s) if listed_s else None,
        "by_restart": {
            str(d): {
                "trials": sum(1 for t in trials if t["restart_after_s"] == d),
                "lost": sum(t["lost"] for t in trials if t["restart_after_s"] == d),
                "mv_surplus": sum(t["mv_surplus"] for t in trials if t["restart_after_s"] == d),
                "ready_to_listed_s_max": max(
                    (t["ready_to_listed_s"] for t in trials if t["restart_after_s"] == d),
                    default=None,
                ),
            }
            for d in sorted({t["restart_after_s"] for t in trials})
        },
        "per_trial": trials,
    }
    summary["ok"] = (
        summary["relisted_every_time"]
        and all(v == 0 for v in total.values())
        and summary["mv_surplus"] == 0
        and summary["runs_final_surplus"] == 0
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
