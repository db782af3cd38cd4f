"""``otel-guard demo``: a guard, a runaway fleet being stopped, and the stop reasons.

The orchestrator (this process) runs the real guard server with the embedded ClickHouse store
and spawns agent processes (``python -m guard.demo._agents``) that use the public SDK exactly
as an application would. See :func:`run_demo`.
"""

from __future__ import annotations

from guard.demo._fleet import STAGED_REASONS, AgentProcess, build_fleet, demo_policy
from guard.demo._orchestrate import DemoOptions, run_demo

__all__ = [
    "STAGED_REASONS",
    "AgentProcess",
    "DemoOptions",
    "build_fleet",
    "demo_policy",
    "run_demo",
]
