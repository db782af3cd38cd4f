"""What the SDK remembers of the calls it counted from third-party spans (part of
:mod:`guard.sdk._foreign`): per step, a :class:`CallLedger` of the calls both sides reported
until the other side does; per run, :class:`RunCalls` (the counted spans, their parents, the
calls integrations recorded). Bounded: a run keeps the last :data:`_SEEN_MAX` span ids and
:data:`_INTEGRATED_MAX` integration calls.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from guard.sdk._run import LiveRun

__all__ = [
    "CallLedger",
    "RunCalls",
    "calls_of",
    "claim_integrated",
    "native_tools",
    "note_integrated",
    "record_integrated",
]

_SEEN_MAX = 256  # counted span ids kept per run (parents end within a few calls)


class CallLedger:
    """A step's model calls, as both sides reported them, until the other side does.

    ``counted``: calls counted from a third-party span that no ``step.model_call`` claimed
    yet; ``recorded``: explicit ``step.model_call`` records that no third-party span matched
    yet. An entry is ``(response_id, input_tokens, output_tokens, cost_usd)``. Created on a
    step when a third-party span starts in it, so steps without one pay nothing.
    """

    __slots__ = ("counted", "recorded")

    def __init__(self) -> None:
        self.counted: list[tuple[str | None, int, int, float | None]] = []
        self.recorded: list[tuple[str | None, int, int, float | None]] = []

    @staticmethod
    def _take(entries: list, response_id: str | None, inp: int, out: int) -> Any:
        for i, (rid, i_tok, o_tok, _cost) in enumerate(entries):
            # both have a response id: it decides; else the counters do
            if rid == response_id if response_id and rid else (i_tok, o_tok) == (inp, out):
                return entries.pop(i)
        return None

    def claim(self, response_id: str | None, inp: int, out: int) -> Any:
        """The counted third-party call this explicit record reports again, or ``None``."""
        return self._take(self.counted, response_id, inp, out)

    def matches_recorded(self, response_id: str | None, inp: int, out: int) -> bool:
        """True when a third-party span reports a call the step already recorded."""
        return self._take(self.recorded, response_id, inp, out) is not None


class RunCalls:
    """Per run: ids of counted third-party model spans and of their parents (aggregates), the
    parents of counted tool spans, and how many tool calls were counted from spans."""

    __slots__ = ("integrated", "parents", "spans", "tool_parents", "tools")

    def __init__(self) -> None:
        self.spans: dict[int, None] = {}
        self.parents: dict[int, None] = {}
        self.tool_parents: dict[int, None] = {}
        self.tools = 0
        # calls an integration recorded, (response id, input, output): a third-party span of
        # one that started outside its step (OpenInference's LangChain LLM span opens before
        # the call) is matched here, once
        self.integrated: list[tuple[str | None, int, int, None]] = []

    def take_integrated(self, response_id: str | None, inp: int, out: int) -> bool:
        """Whether a call an integration recorded matches (and use it up)."""
        return CallLedger._take(self.integrated, response_id, inp, out) is not None

    def add(self, span_id: int, parent_id: int, tool: bool = False) -> None:
        pairs = (
            ((self.tool_parents, parent_id),)
            if tool
            else (
                (self.spans, span_id),
                (self.parents, parent_id),
            )
        )
        for seen, key in pairs:
            if key:
                seen[key] = None
                if len(seen) > _SEEN_MAX:
                    del seen[next(iter(seen))]


def calls_of(run: LiveRun) -> RunCalls:
    calls = run.foreign_calls
    if calls is None:
        calls = run.foreign_calls = RunCalls()
    return calls


_INTEGRATED_MAX = 64  # recent integration calls kept per run for that match


def note_integrated(run: LiveRun, response_id: str | None, inp: int, out: int) -> None:
    """An integration recorded this call of ``run`` (see :attr:`RunCalls.integrated`)."""
    kept = calls_of(run).integrated
    kept.append((response_id, inp, out, None))  # CallLedger's entry shape
    if len(kept) > _INTEGRATED_MAX:
        del kept[0]


def native_tools(run: LiveRun) -> int:
    """Tool calls the run recorded itself (``@guard.tool``, ``step.tool_call``)."""
    calls = run.foreign_calls
    return run.budget.usage().tool_calls - (calls.tools if calls is not None else 0)


# Set while an integration records its own call through step.model_call: that record is the
# call itself, never a repeat of one the integration recorded before in the same step.
_integrating: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "otel_guard_integrating", default=False
)
_STEP_INTEGRATED_MAX = 16  # integration calls kept per step for the code's own report of them


def record_integrated(step: Any, response_id: str | None, inp: int, out: int, **kw: Any) -> Any:
    """An integration records its call on ``step`` (``step.model_call(...)``, whose cost it
    returns). The code's own ``step.model_call`` of the same call afterwards (the quickstart's
    explicit record, next to ``guard.instrument()``) is then claimed, not counted again: by
    response id when both have one, else by the same input and output tokens in that step."""
    token = _integrating.set(True)
    cost = None
    try:
        cost = step.model_call(response_id=response_id, input_tokens=inp, output_tokens=out, **kw)
        return cost
    finally:
        _integrating.reset(token)
        kept = step.integrated
        if kept is None:
            kept = step.integrated = []
        kept.append((response_id, inp, out, cost))  # CallLedger's entry shape
        del kept[:-_STEP_INTEGRATED_MAX]


def claim_integrated(step: Any, response_id: str | None, inp: int, out: int) -> Any:
    """The integration's record that the code's own ``step.model_call`` reports again (used
    up), or ``None``; never while the integration itself records."""
    if _integrating.get():
        return None
    return CallLedger._take(step.integrated, response_id, inp, out)
