"""Tenant overshoot under concurrency: 32 runs in 4 agent processes spend one tenant's rolling
``cost_usd`` window through one real guard. With ``step.reserve`` the tenant never spends more
than one reservation past its limit; with usage reported after each call only, at most one
call per run in flight. And the guard's window ends equal to what the runs really spent
(spans that arrive after their run ended still count)."""

from __future__ import annotations

import pytest
from _wait import wait_until

from guard.cli._client import AdminClient
from guard.server import MemorySink, ServerThread

from ._tenant_proc import fleet
from .conftest import config

pytestmark = pytest.mark.slow
LIMIT, PRICE, PROCS, RUNS_PER_PROC = 0.60, 0.01, 4, 8


@pytest.mark.parametrize(("mode", "bound_usd"), [("reserve", PRICE), ("plain", 32 * PRICE)])
def test_32_runs_in_4_processes_do_not_oversell_the_tenant(mode: str, bound_usd: float) -> None:
    tenants = {"acme": {"rolling": [{"metric": "cost_usd", "limit": LIMIT, "window_s": 3600}]}}
    with ServerThread(config(tenants=tenants), sink=MemorySink()) as srv:
        lines = fleet(srv.address, "acme", mode, procs=PROCS, runs=RUNS_PER_PROC, price=PRICE)
        ended = [x for x in lines if x["event"] == "ended"]
        assert len(ended) == PROCS * RUNS_PER_PROC
        assert {x["reason"] for x in ended} == {"tenant_budget"}, ended
        spent = sum(x["cost_usd"] for x in ended)
        calls = sum(x["model_calls"] for x in ended)
        assert spent <= LIMIT + bound_usd + 1e-9, (spent, calls)
        assert calls * PRICE == pytest.approx(spent)
        assert spent >= LIMIT / 2, spent  # the tenant's budget was actually spent
        # Every span reaches the guard's window, late ones included (bounded wait).
        with AdminClient(srv.address) as admin:

            def used() -> float:
                (tb,) = admin.tenant_budgets("acme").tenants
                return tb.windows[0].used

            wait_until(
                lambda: abs(used() - spent) < 1e-6,
                10,
                lambda: f"acme's window to hold the {spent} USD spent (used {used()})",
                interval_s=0.05,
            )
