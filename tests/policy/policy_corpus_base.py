"""Trace model and runner for the loop-detector corpus (see policy_corpus.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from guard.policy import Action, Fingerprinter, LoopDetector, LoopSettings

__all__ = ["EMPTY", "Call", "Step", "Trace", "TraceResult", "one_call_steps", "run_trace", "step"]


@dataclass(frozen=True)
class Call:
    tool: str
    args: Any
    result: Any


@dataclass(frozen=True)
class Step:
    calls: tuple[Call, ...] = ()
    facts: tuple[str, ...] | None = None  # the task state after the step, when the agent says
    progress: bool | None = None


@dataclass(frozen=True)
class Trace:
    name: str
    label: str  # "loop" | "legit"
    steps: tuple[Step, ...]
    hard: bool = False
    note: str = ""
    tags: tuple[str, ...] = field(default=())
    loop_start: int = 0  # loops: index of the step where the looping began (for the delay)


def step(*calls: tuple[str, Any, Any], facts: tuple[str, ...] | None = None, progress=None) -> Step:
    return Step(tuple(Call(*c) for c in calls), facts, progress)


def one_call_steps(calls: list[tuple[str, Any, Any]]) -> tuple[Step, ...]:
    return tuple(step(c) for c in calls)


EMPTY: list[Any] = []


@dataclass(frozen=True)
class TraceResult:
    stopped: bool
    warned: bool
    stop_call: int | None  # tool calls seen when the run was stopped
    pattern: str | None
    hits: int
    stop_step: int | None = None  # index of the step in which the run was stopped


def run_trace(trace: Trace, settings: LoopSettings | None = None) -> TraceResult:
    """Feed a trace to a fresh detector the way the SDK and the guard do."""
    settings = settings or LoopSettings()
    fp = Fingerprinter(b"corpus-key", ignore_fields=settings.ignore_fields)
    det = LoopDetector(settings)
    warned, n = False, 0
    for index, step in enumerate(trace.steps):
        verdicts = []
        for call in step.calls:
            n += 1
            v = det.observe_action(fp.action(call.tool, call.args), fp.result(call.result))
            verdicts.append((n, v))
        state = fp.state(step.facts) if step.facts is not None else None
        verdicts.append(
            (n, det.end_step(state=state, progress=step.progress, acted=bool(step.calls)))
        )
        for i, v in verdicts:
            if v.level is Action.STOP:
                return TraceResult(True, warned, i, v.pattern, det.hits, index)
            warned = warned or v.level is Action.WARN
    return TraceResult(False, warned, None, None, det.hits)
