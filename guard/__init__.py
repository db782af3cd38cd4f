"""otel-guard: OpenTelemetry-native observability and guard sidecar for LLM agents.

The agent SDK::

    import guard

    @guard.run(agent="refund-bot", max_steps=12, max_cost_usd=0.50, deadline_s=90)
    async def handle(request): ...

SDK names are imported lazily (PEP 562), so ``import guard.policy`` or the guard server never
pull in OpenTelemetry through this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from guard._version import __version__
from guard.errors import BudgetExceeded, ConfigError, GuardError, GuardUnavailable, RunStopped

if TYPE_CHECKING:  # pragma: no cover
    from guard._native import native_paths
    from guard.integrations import instrument, uninstrument
    from guard.policy import Limits, LoopSettings, Outcome, Reason, Remaining, Status
    from guard.sdk import (
        Run,
        Settings,
        Step,
        ToolBatch,
        admit_tools,
        configure,
        current_run,
        evidence,
        flush,
        progress,
        run,
        run_tools,
        shutdown,
        stats,
        step,
        tool,
    )

_LAZY = {
    "Limits": "guard.policy",
    "LoopSettings": "guard.policy",
    "Outcome": "guard.policy",
    "Reason": "guard.policy",
    "Remaining": "guard.policy",
    "Status": "guard.policy",
    "Run": "guard.sdk",
    "Settings": "guard.sdk",
    "Step": "guard.sdk",
    "ToolBatch": "guard.sdk",
    "admit_tools": "guard.sdk",
    "configure": "guard.sdk",
    "current_run": "guard.sdk",
    "evidence": "guard.sdk",
    "flush": "guard.sdk",
    "instrument": "guard.integrations",
    "native_paths": "guard._native",
    "progress": "guard.sdk",
    "run": "guard.sdk",
    "run_tools": "guard.sdk",
    "shutdown": "guard.sdk",
    "stats": "guard.sdk",
    "step": "guard.sdk",
    "tool": "guard.sdk",
    "uninstrument": "guard.integrations",
}

__all__ = [
    "BudgetExceeded",
    "ConfigError",
    "GuardError",
    "GuardUnavailable",
    "Limits",
    "LoopSettings",
    "Outcome",
    "Reason",
    "Remaining",
    "Run",
    "RunStopped",
    "Settings",
    "Status",
    "Step",
    "ToolBatch",
    "__version__",
    "admit_tools",
    "configure",
    "current_run",
    "evidence",
    "flush",
    "instrument",
    "native_paths",
    "progress",
    "run",
    "run_tools",
    "shutdown",
    "stats",
    "step",
    "tool",
    "uninstrument",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'guard' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
