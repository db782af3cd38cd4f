"""The demo's fleet plan: which processes run which agents for which tenants, and the policy
the demo guard enforces. Pure data, so tests and the README can reason about it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from guard.demo._model import DEMO_PRICES

__all__ = [
    "BUDGET_TENANT",
    "BUDGET_TENANT_LIMIT_USD",
    "CANCEL_TENANT",
    "STAGED_REASONS",
    "AgentProcess",
    "build_fleet",
    "demo_policy",
]

# The tenant whose hourly budget two processes exhaust together, and the tenant the operator
# cancels in the middle of the demo.
BUDGET_TENANT = "umbrella"
CANCEL_TENANT = "hooli"
BUDGET_TENANT_LIMIT_USD = 1.0

# Every stop reason the demo stages; the demo fails (exit 1) when one does not occur.
STAGED_REASONS: tuple[str, ...] = (
    "final_answer",
    "max_steps",
    "loop_detected",
    "no_progress",
    "token_budget",
    "cost_budget",
    "deadline",
    "tenant_budget",
    "operator_cancel",
)


@dataclass(slots=True)
class AgentProcess:
    """One OS process of simulated agents: a tenant and waves of scenario items."""

    name: str
    tenant: str
    waves: list[list[dict[str, Any]]] = field(default_factory=list)

    @property
    def runs(self) -> int:
        return sum(len(w) for w in self.waves)


def demo_policy() -> dict[str, Any]:
    """The policy file the demo guard runs with (same shape and keys as ``guard.yaml``)."""
    return {
        "runs": {
            "max_steps": 60,
            "deadline_s": 120,
            "loop": {"window": 20, "repeat_threshold": 3, "no_progress_steps": 6},
            "soft_thresholds": [0.7, 0.9],
        },
        "tenants": {
            "acme": {
                "max_concurrent_runs": 20,
                "rolling": [{"metric": "cost_usd", "limit": 25.0, "window_s": 3600}],
            },
            BUDGET_TENANT: {
                "rolling": [
                    {"metric": "cost_usd", "limit": BUDGET_TENANT_LIMIT_USD, "window_s": 3600}
                ]
            },
        },
        "prices": {
            "version": "demo-2026-11",
            "models": {m: {"input": i, "output": o} for m, (i, o) in DEMO_PRICES.items()},
        },
    }


def _healthy(count: int, *, start_s: float, span_s: float, first_n: int) -> list[dict[str, Any]]:
    gap = span_s / max(count, 1)
    return [
        {
            "kind": "healthy",
            "n": first_n + i,
            "delay_s": round(start_s + i * gap, 2),
            "params": {"steps": 3 + (first_n + i) % 4, "pause_s": 0.1 + 0.05 * (i % 3)},
        }
        for i in range(count)
    ]


def build_fleet(*, quick: bool) -> list[AgentProcess]:
    """Six processes, five tenants. ``quick`` keeps every runaway and trims the healthy load
    and the pauses, for tests."""
    # (healthy runs, spread seconds) per tenant; the runaways start at staggered times in the
    # full demo so the terminal tells the story one failure at a time.
    span = 0.0 if quick else 24.0
    at = (lambda s: 0.0) if quick else (lambda s: s)
    count = (lambda q, f: q) if quick else (lambda q, f: f)

    acme = AgentProcess("acme-1", "acme")
    acme.waves.append(
        [
            *_healthy(count(2, 14), start_s=0.0, span_s=span, first_n=0),
            {"kind": "never_stops", "n": 1, "delay_s": at(2.0)},
        ]
    )
    globex = AgentProcess("globex-1", "globex")
    globex.waves.append(
        [
            *_healthy(count(1, 8), start_s=at(1.0), span_s=span, first_n=100),
            {"kind": "ab_oscillation", "n": 1, "delay_s": at(4.0)},
            {"kind": "same_empty_result", "n": 2, "delay_s": at(6.5)},
            {"kind": "stagnation", "n": 3, "delay_s": at(9.0)},
        ]
    )
    initech = AgentProcess("initech-1", "initech")
    initech.waves.append(
        [
            *_healthy(count(1, 8), start_s=at(2.0), span_s=span, first_n=200),
            {"kind": "token_burner", "n": 1, "delay_s": at(3.0)},
            {"kind": "cost_burner", "n": 2, "delay_s": at(7.5)},
            {"kind": "slow_tool", "n": 3, "delay_s": at(11.0)},
        ]
    )
    # Two processes of one tenant spend against the same hourly budget; neither could exhaust
    # it alone in the time the demo runs. After the guard stops them, each tries one more run,
    # which the guard denies before its first step.
    umbrella = [AgentProcess(f"{BUDGET_TENANT}-{i}", BUDGET_TENANT) for i in (1, 2)]
    for i, proc in enumerate(umbrella):
        proc.waves.append([{"kind": "budget_spender", "n": i, "delay_s": at(13.0)}])
        proc.waves.append([{"kind": "budget_denied", "n": 10 + i, "delay_s": 0.3}])
    # The operator cancels this tenant mid-demo (the orchestrator calls GuardAdmin.Cancel);
    # the tenant's later runs are admitted again and complete.
    hooli = AgentProcess(f"{CANCEL_TENANT}-1", CANCEL_TENANT)
    hooli.waves.append([{"kind": "long_support", "n": i, "delay_s": at(1.0)} for i in (1, 2)])
    hooli.waves.append(_healthy(count(1, 6), start_s=0.0, span_s=span / 3, first_n=300))
    return [acme, globex, initech, *umbrella, hooli]
