"""The SDK's side of tenant allowances against a real guard: ceilings pushed with the Admit,
more asked for when a reservation does not fit, ``exhausted`` stops the run before the call,
and a guard that cannot answer means fail-open (counted) or, with ``fail_closed``, a refusal."""

from __future__ import annotations

import pytest

import guard
from guard.policy import PolicyConfig
from guard.sdk._run import current_run_or_none
from guard.server import MemorySink, ServerThread


def _guard(limit: float) -> ServerThread:
    cfg = PolicyConfig.from_dict(
        {
            "tenants": {
                "acme": {"rolling": [{"metric": "cost_usd", "limit": limit, "window_s": 3600}]}
            }
        }
    )
    return ServerThread(cfg, sink=MemorySink())


def test_reservations_ask_for_more_and_exhausted_stops_before_the_call(sink) -> None:
    seen = {"calls": 0}
    with _guard(0.10) as srv:
        guard.configure(endpoint=srv.address, tenant="acme", admit_timeout_ms=3000)

        @guard.run(agent="spender", max_steps=100)
        def agent() -> None:
            run = current_run_or_none()
            seen["first"] = run.allowance.max_cost_usd
            while True:
                with guard.step() as step, step.reserve(cost_usd=0.03):
                    seen["calls"] += 1
                    step.model_call(model="gpt-4.1", cost_usd=0.03)

        with pytest.raises(guard.RunStopped) as stop:
            agent()
        stats = guard.stats()
        guard.shutdown()
    o = stop.value.outcome
    assert seen["first"] == 0.0  # nothing is lent ahead of a call
    assert seen["calls"] == 3 and o.cost_usd == pytest.approx(0.09)  # 0.12 would not fit
    assert (o.reason, o.decided_by) == ("tenant_budget", "guard")
    assert "needs" in o.message and "left to grant" in o.message, o.message
    # one ask per call (each lent exactly its reservation), and the one refused
    assert stats["control_allowance_requests"] == 4 and stats["control_allowance_exhausted"] == 1


def test_without_reserve_an_exhausted_answer_stops_the_run_at_its_next_call(sink) -> None:
    with _guard(0.10) as srv:
        guard.configure(endpoint=srv.address, tenant="acme", admit_timeout_ms=3000)

        @guard.run(agent="plain", max_steps=100)
        def agent() -> None:
            while True:
                with guard.step() as step:
                    step.model_call(model="gpt-4.1", cost_usd=0.03)

        with pytest.raises(guard.RunStopped) as stop:
            agent()
        guard.shutdown()
    o = stop.value.outcome
    assert (o.reason, o.decided_by) == ("tenant_budget", "guard")
    assert o.model_calls == 3 and o.cost_usd <= 0.10  # the 4th call would not have fit


@pytest.mark.parametrize("fail_closed", [False, True])
def test_a_guard_that_cannot_answer_is_fail_open_or_refused(sink, fail_closed) -> None:
    seen: dict = {}
    srv = _guard(100.0).__enter__()
    try:
        # the guard is stopped mid-run: neither the RunEnded ack nor the last spans' export can
        # succeed, and shutdown need not wait for them
        guard.configure(
            endpoint=srv.address,
            tenant="acme",
            admit_timeout_ms=300,
            export_timeout_s=0.2,
            shutdown_ack_timeout_s=0.1,
        )

        @guard.run(agent="r", max_steps=100, fail_closed=fail_closed)
        def agent() -> None:
            with guard.step() as step, step.reserve(cost_usd=0.005):
                step.model_call(model="gpt-4.1", cost_usd=0.005)  # granted
            srv.stop()  # the guard goes away
            with guard.step() as step, step.reserve(cost_usd=0.05):
                seen["ran"] = True
                step.model_call(model="gpt-4.1", cost_usd=0.05)

        if fail_closed:
            with pytest.raises(guard.RunStopped) as stop:
                agent()
            o = stop.value.outcome
            assert o.reason == "tenant_budget" and "fail_closed" in o.message, o.message
            assert "ran" not in seen and o.cost_usd == pytest.approx(0.005)
        else:
            agent()
            assert seen["ran"]
            assert guard.stats()["control_allowance_fail_open"] >= 1
    finally:
        guard.shutdown()
        srv.__exit__(None, None, None)
