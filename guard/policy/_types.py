"""Value types shared by the SDK, the guard and the store: the stop taxonomy, limits, usage,
decisions and outcomes. Pure data: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum
from typing import Any

__all__ = [
    "DEFAULT_SOFT_THRESHOLDS",
    "METRIC_REASON",
    "USAGE_COUNTERS",
    "Action",
    "DecidedBy",
    "Decision",
    "Limits",
    "LoopSettings",
    "Outcome",
    "Phase",
    "Reason",
    "Status",
    "Usage",
]


class Status(StrEnum):
    """How a run ended: the ``status`` of its :class:`Outcome`."""

    COMPLETED = "completed"
    DEGRADED = "degraded"
    TERMINATED = "terminated"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Reason(StrEnum):
    """Why a run ended, or why a directive was issued."""

    FINAL_ANSWER = "final_answer"
    MAX_STEPS = "max_steps"
    MAX_TOOL_CALLS = "max_tool_calls"
    DEADLINE = "deadline"
    TOKEN_BUDGET = "token_budget"
    COST_BUDGET = "cost_budget"
    TENANT_BUDGET = "tenant_budget"
    LOOP_DETECTED = "loop_detected"
    NO_PROGRESS = "no_progress"
    MISSING_EVIDENCE = "missing_evidence"
    INVALID_DECISION = "invalid_decision"
    TOOL_ERROR = "tool_error"
    MODEL_ERROR = "model_error"
    USER_CANCEL = "user_cancel"
    OPERATOR_CANCEL = "operator_cancel"
    AGENT_LOST = "agent_lost"
    ERROR = "error"


# The status each stop reason is recorded with, unless a caller says otherwise.
REASON_STATUS: dict[Reason, Status] = {
    Reason.FINAL_ANSWER: Status.COMPLETED,
    Reason.MAX_STEPS: Status.TERMINATED,
    Reason.MAX_TOOL_CALLS: Status.TERMINATED,
    Reason.DEADLINE: Status.TERMINATED,
    Reason.TOKEN_BUDGET: Status.TERMINATED,
    Reason.COST_BUDGET: Status.TERMINATED,
    Reason.TENANT_BUDGET: Status.TERMINATED,
    Reason.LOOP_DETECTED: Status.TERMINATED,
    Reason.NO_PROGRESS: Status.TERMINATED,
    Reason.MISSING_EVIDENCE: Status.DEGRADED,
    Reason.INVALID_DECISION: Status.FAILED,
    Reason.TOOL_ERROR: Status.FAILED,
    Reason.MODEL_ERROR: Status.FAILED,
    Reason.USER_CANCEL: Status.CANCELLED,
    Reason.OPERATOR_CANCEL: Status.CANCELLED,
    Reason.AGENT_LOST: Status.FAILED,
    Reason.ERROR: Status.FAILED,
}


class Action(StrEnum):
    """What a decision asks the run to do, weakest first.

    ``rank`` orders them by strength (CONTINUE 0, WARN 1, WRAP_UP 2, STOP 3): a run acts on a
    decision only when it outranks what it was already told.
    """

    CONTINUE = "continue"
    WARN = "warn"  # first soft threshold: stop exploring
    WRAP_UP = "wrap_up"  # second soft threshold: summarise now
    STOP = "stop"

    rank: int  # set below, per member (a plain attribute: read on every span)


for _rank, _action in enumerate(Action):  # definition order is the order of strength
    _action.rank = _rank
del _rank, _action


# The stop reason of each budget metric (a limit's name in ``Decision.metric``): what a soft
# threshold or a forecast on that metric is reported as.
METRIC_REASON: dict[str, Reason] = {
    "elapsed_s": Reason.DEADLINE,
    "steps": Reason.MAX_STEPS,
    "model_calls": Reason.MAX_STEPS,
    "tokens": Reason.TOKEN_BUDGET,
    "cost_usd": Reason.COST_BUDGET,
    "tool_calls": Reason.MAX_TOOL_CALLS,
}


class Phase(StrEnum):
    """When a decision is taken: before a step, or after a model call or tool batch."""

    BEFORE_STEP = "before_step"
    AFTER_MODEL_CALL = "after_model_call"
    AFTER_TOOL_BATCH = "after_tool_batch"


class DecidedBy(StrEnum):
    SDK = "sdk"
    GUARD = "guard"
    OPERATOR = "operator"


DEFAULT_SOFT_THRESHOLDS: tuple[float, float] = (0.7, 0.9)

# The integer counters of a Usage, in wire and table order (cost_usd is kept apart: it may
# be unknown).
USAGE_COUNTERS: tuple[str, ...] = (
    "steps",
    "model_calls",
    "tool_calls",
    "tool_attempts",
    "input_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cached_tokens",
)


@dataclass(frozen=True, slots=True)
class LoopSettings:
    """Loop and stagnation detection settings. The defaults: a window of the last 20 tool
    calls, a loop at the third occurrence of the same call with the same result, and
    stagnation after 8 steps without progress."""

    window: int = 20
    repeat_threshold: int = 3
    no_progress_steps: int = 8
    # Tool-argument fields ignored by canonicalisation, e.g. pagination cursors.
    ignore_fields: tuple[str, ...] = ("page", "offset", "cursor", "request_id", "timestamp")
    # Tools declared as polls (a job status checked until it changes): their calls are judged
    # by the poll rule (guard.policy._polls), never by the repeat, cycle or same-result patterns.
    poll_tools: tuple[str, ...] = ()
    # The same poll (tool and arguments) answering the same result this many times in a row is
    # a loop (pattern poll_unchanged); ``None``: never. Ten: a wait of three times the repeat
    # threshold, each poll a model turn that learnt nothing (a longer wait belongs in the tool).
    max_unchanged_polls: int | None = 10


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-run limits. ``None`` means disabled, never zero.

    Effective limits are the tightest of the policy file and the decorator: see
    :meth:`tighten`.
    """

    max_steps: int | None = None
    max_tool_calls: int | None = None
    max_model_calls: int | None = None
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    deadline_s: float | None = None
    reserve_tokens: int | None = None  # held back from max_tokens for the final answer
    reserve_s: float | None = None  # held back from deadline_s for the final answer
    soft_thresholds: tuple[float, ...] = DEFAULT_SOFT_THRESHOLDS
    loop: LoopSettings = field(default_factory=LoopSettings)
    pause_freezes_deadline: bool = False
    timeout_margin_s: float = 0.5  # run.timeout() ends this long before the deadline
    # A step or paid tool call reserved by nothing explicit holds the run's mean cost (and
    # tokens) per step / per call of that tool while it runs (guard.sdk._implicit).
    implicit_estimates: bool = True

    def tighten(self, other: Limits | None) -> Limits:
        """Return the tightest combination of two limit sets (a ``None`` side loses)."""
        if other is None:
            return self
        merged: dict[str, Any] = {}
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name == "loop":
                merged[f.name] = LoopSettings(
                    window=min(a.window, b.window),
                    repeat_threshold=min(a.repeat_threshold, b.repeat_threshold),
                    no_progress_steps=min(a.no_progress_steps, b.no_progress_steps),
                    ignore_fields=tuple(sorted(set(a.ignore_fields) | set(b.ignore_fields))),
                    # A poll declaration is a fact about a tool that either side may know,
                    # not a limit: the union (the poll rule itself takes the smaller bound).
                    poll_tools=tuple(sorted(set(a.poll_tools) | set(b.poll_tools))),
                    max_unchanged_polls=_min_bound(a.max_unchanged_polls, b.max_unchanged_polls),
                )
            elif f.name == "soft_thresholds":
                merged[f.name] = tuple(min(x, y) for x, y in zip(a, b, strict=False)) or a or b
            elif f.name == "pause_freezes_deadline":
                merged[f.name] = a and b  # a frozen deadline is the looser choice
            elif f.name == "timeout_margin_s":
                merged[f.name] = max(a, b)
            elif f.name == "implicit_estimates":
                # A switch, not a limit: held only while neither side turned it off (the
                # decorator's side is on unless a Limits object says otherwise).
                merged[f.name] = a and b
            elif a is None or b is None:
                merged[f.name] = b if a is None else a
            else:
                merged[f.name] = min(a, b)
        return Limits(**merged)


def _min_bound(a: int | None, b: int | None) -> int | None:
    """The smaller of two bounds, where ``None`` (no bound) loses."""
    if a is None or b is None:
        return b if a is None else a
    return min(a, b)


@dataclass(slots=True)
class Usage:
    """What a run has spent. ``cost_usd`` is ``None`` while every model used is unpriced."""

    steps: int = 0
    model_calls: int = 0
    tool_calls: int = 0
    tool_attempts: int = 0
    input_tokens: int = 0  # includes cached tokens (GenAI semconv)
    output_tokens: int = 0  # includes reasoning tokens
    reasoning_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float | None = None

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def add(self, other: Usage) -> None:
        """Add another usage in place (``None`` cost stays unknown only if both are)."""
        for name in USAGE_COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        if other.cost_usd is not None:
            self.cost_usd = (self.cost_usd or 0.0) + other.cost_usd

    def assign(self, other: Usage) -> None:
        """Set every field from another usage, in place (this object's identity is kept)."""
        for name in USAGE_COUNTERS:
            setattr(self, name, getattr(other, name))
        self.cost_usd = other.cost_usd

    def copy(self) -> Usage:
        return replace(self)


@dataclass(frozen=True, slots=True)
class Decision:
    """The result of one policy evaluation.

    ``utilisation`` is the highest fraction of any limit used (0..1+, ``None`` when no limit
    is set); ``metric`` names that limit. ``message`` carries the numbers.
    """

    action: Action
    status: Status | None = None
    reason: Reason | None = None
    utilisation: float | None = None
    metric: str | None = None
    message: str = ""

    @property
    def stop(self) -> bool:
        return self.action is Action.STOP


CONTINUE = Decision(Action.CONTINUE)


@dataclass(slots=True)
class Outcome:
    """The structured termination record of one run: how it ended (status), why (reason),
    and what it spent and did (the counters).

    The same record is raised to the user in ``RunStopped.outcome``, sent over the wire in
    ``RunEnded`` and written as one row of ``otel_guard.runs``.
    """

    run_id: str
    status: Status
    reason: Reason
    message: str = ""
    parent_run_id: str | None = None
    tenant: str = ""
    agent: str = ""
    trace_id: str = ""
    steps: int = 0
    model_calls: int = 0
    tool_calls: int = 0
    tool_attempts: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float | None = None
    elapsed_ms: int = 0
    deadline_ms: int | None = None
    last_tool: str | None = None
    last_action_hash: str | None = None
    loop_hits: int = 0
    partial_result: bool = False
    recoverable: bool = False
    decided_by: DecidedBy = DecidedBy.SDK
    price_book_version: str = ""
    started_at: float = 0.0  # Unix seconds
    ended_at: float = 0.0  # Unix seconds

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def usage(self) -> Usage:
        return Usage(**{n: getattr(self, n) for n in USAGE_COUNTERS}, cost_usd=self.cost_usd)

    @classmethod
    def from_usage(
        cls, usage: Usage, *, limits: Limits, elapsed_s: float, **fields: Any
    ) -> Outcome:
        """An outcome carrying every counter of ``usage``, the elapsed time and the deadline.

        The SDK and the guard both end runs through this, so their records cannot drift.
        """
        return cls(
            **{n: getattr(usage, n) for n in USAGE_COUNTERS},
            cost_usd=usage.cost_usd,
            elapsed_ms=int(elapsed_s * 1000),
            deadline_ms=None if limits.deadline_s is None else int(limits.deadline_s * 1000),
            **fields,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (enums as their string values)."""
        d = asdict(self)
        for k in ("status", "reason", "decided_by"):
            d[k] = str(d[k].value if hasattr(d[k], "value") else d[k])
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Outcome:
        """Inverse of :meth:`to_dict`; unknown keys are ignored (forward compatibility)."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in data.items() if k in known}
        kw["status"] = Status(kw["status"])
        kw["reason"] = Reason(kw["reason"])
        kw["decided_by"] = DecidedBy(kw.get("decided_by", "sdk"))
        cost = kw.get("cost_usd")
        if cost is not None and (not isinstance(cost, int | float) or math.isnan(cost)):
            kw["cost_usd"] = None
        return cls(**kw)
