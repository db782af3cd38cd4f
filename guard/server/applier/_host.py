"""What the span applier (:mod:`guard.server.applier._applier`) works with: the interface of its host
(the registry, :class:`SpanHost`) and one request's state per run (:class:`Touched`, recorded
in the runs' budgets by :func:`flush`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from guard.policy import Decision, Phase, PolicyConfig, Usage
    from guard.server.decode._schema import Observation
    from guard.server.runs._state import RunState
    from guard.server.tenants._interface import TenantBudgets

__all__ = ["SpanHost", "Touched", "flush"]


class Touched:
    """What one request did to one run, until the run is decided at the request's end: the
    phase of its last counted span, the strongest loop verdict its spans produced, and the
    tool calls (and attempts) counted but not yet recorded in its budget (see :func:`flush`)."""

    __slots__ = ("attempts", "phase", "tools", "verdict")

    def __init__(self, phase: Phase, verdict: Any, tools: int, attempts: int) -> None:
        self.phase = phase
        self.verdict = verdict
        self.tools = tools
        self.attempts = attempts


def flush(touched: dict[RunState, Touched], spent: dict[str, Usage]) -> None:
    """Record the tool calls counted in ``touched`` in their runs' budgets (one call per run)
    and in their tenants' usage for this request.

    The counts are ints >= 0 (attempts come from the decoder, which refuses anything else),
    so ``record_tool_calls`` cannot refuse them.
    """
    for run, entry in touched.items():
        n = entry.tools
        if n:
            attempts = entry.attempts
            run.budget.record_tool_calls(n, attempts=attempts)
            usage = spent[run.tenant]
            usage.tool_calls += n
            usage.tool_attempts += attempts
            entry.tools = entry.attempts = 0


class SpanHost(Protocol):
    """What the span path needs of its registry: the table's maps (read-only), the tenants'
    budgets, and one method of each part it hands a run to (each bound once by the
    registry, so calling one costs an attribute lookup, as a method of its own would)."""

    # read-only to the span path: properties, so that any mapping (the table's dicts) fits
    @property
    def runs(self) -> Mapping[str, RunState]: ...
    @property
    def by_trace(self) -> Mapping[bytes, RunState]: ...
    @property
    def ended(self) -> Mapping[str, None]: ...

    max_runs: int
    config: PolicyConfig
    budgets: TenantBudgets
    stats: dict[str, int]
    clock: Callable[[], float]
    # DecisionRouter
    act: Callable[..., None]
    forecast: Callable[[RunState, int], None]
    tenant_cut: Callable[[str, Decision], None]
    # Admission (implicit runs), Rejoin (numbered spans), Lifecycle (the run span's end)
    new_run: Callable[..., RunState]
    make_room: Callable[[str], bool]
    # RunTable: room for a tenant's new run; the span-only runs just heard from, in its LRU
    has_room: Callable[[str], bool]
    take_span_run: Callable[[str], bool]
    touch: Callable[[Iterable[RunState]], None]
    gate: Callable[[RunState, Observation], bool]
    set_tenant: Callable[[RunState, str], None]
    end_run: Callable[..., Any]
