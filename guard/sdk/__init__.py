"""The otel-guard agent SDK: one decorator, per-step spans, local enforcement, real cancel.

Public names are re-exported from :mod:`guard`::

    @guard.run(agent="refund-bot", max_steps=12, deadline_s=90)
    async def handle(request):
        with guard.step() as step:
            step.model_call(model="gpt-4.1", input_tokens=1200, output_tokens=90)
"""

from guard.sdk._api import (
    NULL_RUN,
    NullRun,
    configure,
    current_run,
    evidence,
    flush,
    shutdown,
    stats,
)
from guard.sdk._config import Settings, get_settings
from guard.sdk._decorator import run
from guard.sdk._handle import Run
from guard.sdk._step import Step, current_step, progress, step
from guard.sdk._tools import ToolBatch, admit_tools, run_tools, tool

__all__ = [
    "NULL_RUN",
    "NullRun",
    "Run",
    "Settings",
    "Step",
    "ToolBatch",
    "admit_tools",
    "configure",
    "current_run",
    "current_step",
    "evidence",
    "flush",
    "get_settings",
    "progress",
    "run",
    "run_tools",
    "shutdown",
    "stats",
    "step",
    "tool",
]
