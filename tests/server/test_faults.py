"""The fault suite, with real processes: the guard (``otel-guard serve``, embedded store in a
temp data dir) SIGKILLed mid-fleet and restarted on the same port and data dir, an agent
SIGKILLed, and a store outage. Each trial reads the store back and checks the contract:
one row per run in ``runs`` (FINAL, by run id), ``stop_reasons_1m`` counting each run once,
every live run listed again after a restart and reached by ``cancel --tenant``, and no run
stopped before its limit (the bounded runs stop by max_steps at exactly 30 steps).

The long version (>= 20 kills, fast and slow restarts) is ``benchmarks/soak_guard_kill.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from . import _faults as F
from ._faults import FleetAgent, GuardProc, end_fleet, free_port, listed, running, wait_until

pytestmark = pytest.mark.slow


def _check_records(agents: list[FleetAgent], verdict: dict, *, idle_reason: str) -> None:
    t = F.tally(agents, verdict, idle_reason=idle_reason)
    assert t["runs"] > 0
    # lost, rows twice (FINAL, by run id), rows nobody started, anonymous rows, early stops
    assert all(t[k] == 0 for k in t["examples"]), t
    assert t["runs_final_surplus"] == 0, t
    # the distribution counts every run once, across restarts (the store's half, helper E)
    assert t["mv_surplus"] == 0, t


def test_guard_sigkill_mid_fleet_and_fast_restart_twice(tmp_path: Path) -> None:
    guard = GuardProc(free_port(), tmp_path / "guard").start()
    agents = [FleetAgent(guard.address, t, bounded=8, idle=1) for t in ("acme", "globex")]
    with running(guard, agents):
        for a in agents:
            a.go()
        for kill in range(2):
            # mid-fleet: both idle runs live and bounded runs in flight (on a loaded machine
            # the bounded runs may all be over before the second kill: then idle runs only)
            def mid_fleet() -> bool:
                live = sum(len(a.live()) for a in agents)
                done = all(len(a.ended()) >= 8 for a in agents)
                return live >= 3 or (done and live >= 2)

            wait_until(mid_fleet, 30, "live runs")
            time.sleep(0.2 + 0.3 * kill)
            guard.kill()
            time.sleep(0.5)  # a fast restart (the soak script also waits ~1 s and ~5 s)
            guard.start()

            # every run still live in its agent is listed again, with its identity
            def relisted() -> bool:
                want = set().union(*(a.live() for a in agents))
                seen = listed(guard.address)
                ok = want <= set(seen)
                return ok and all(seen[r].tenant and seen[r].agent for r in want)

            wait_until(relisted, 20, "the live runs to be listed again")
        ended = end_fleet(guard.address, agents, bounded=8)
        for a in agents:  # every idle run, re-registered, is reached by cancel --tenant
            idle = {r for r, k in a.started().items() if k == "idle"}
            assert set(ended["cancelled"][a.tenant]) == idle
        assert ended["undelivered"] == 0
    _check_records(agents, F.store_verdict(guard.data_dir), idle_reason="operator_cancel")


def test_agent_sigkill_ends_its_runs_as_agent_lost_once(tmp_path: Path) -> None:
    guard = GuardProc(free_port(), tmp_path / "guard", grace_s=1.0).start()
    a = FleetAgent(guard.address, "acme", bounded=2, idle=2)
    with running(guard, [a]):
        a.go()
        wait_until(lambda: len(a.ended()) >= 2, 60, "the bounded runs")
        idle = {r for r, k in a.started().items() if k == "idle"}
        wait_until(lambda: idle <= set(listed(guard.address)), 20, "idle runs listed")
        a.kill()
        wait_until(lambda: not (idle & set(listed(guard.address))), 30, "agent_lost")
    _check_records([a], F.store_verdict(guard.data_dir), idle_reason="agent_lost")


def test_store_outage_spools_every_record_and_replays_it_once(tmp_path: Path) -> None:
    # ClickHouse unreachable: a server DSN on a closed port. Records are durable in the data
    # dir (WAL, spool) and acknowledged; once a store is reachable they are replayed, once.
    # The drain's store flush cannot finish either (the records stay in the spool, read back
    # below): a short drain bound.
    closed = free_port()
    dsn = f"http://127.0.0.1:{closed}/"
    guard = GuardProc(free_port(), tmp_path / "guard", dsn=dsn, drain_s=2.0).start()
    agents = [FleetAgent(guard.address, t, bounded=4, idle=1) for t in ("acme", "globex")]
    with running(guard, agents):
        for a in agents:
            a.go()
        assert end_fleet(guard.address, agents, bounded=4)["undelivered"] == 0
    _check_records(agents, F.store_verdict(guard.data_dir), idle_reason="operator_cancel")
