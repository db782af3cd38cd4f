"""Per-run state held by the guard. Memory-compact: ``__slots__``, lazily allocated rings.

One :class:`RunState` per live run. The policy objects (Budget, LoopDetector, Forecaster,
SoftLevel) carry the arithmetic; this class only adds what the guard needs around them:
ownership (which agent session), the trace it lives in, and a tiny ring of recently counted
model calls so each call is counted once even when several instrumentations report it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RunState", "SeenCalls", "SeqGate"]

_SEEN_CAP = 8  # model calls remembered per run for de-duplication
_GATE_MAX = 1024  # numbered spans above the floor remembered per restored run


class SeqGate:
    """Which numbered spans (``guard.seq``) of a re-registered run are already counted: every
    one ``<= floor`` (the snapshot's ``span_seq``, then advanced over contiguous arrivals) and
    the few above it that arrived out of order. Lets each span count once however often the
    exporter retries it. Bounded: gaps that never fill (spans the exporter dropped) are given
    up once :data:`_GATE_MAX` numbers wait above them."""

    __slots__ = ("above", "floor")

    def __init__(self, floor: int) -> None:
        self.floor = floor
        self.above: set[int] = set()

    def seen(self, seq: int) -> bool:
        """True if ``seq`` was counted before; else remembers it (the caller counts it)."""
        if seq <= self.floor or seq in self.above:
            return True
        above = self.above
        above.add(seq)
        if len(above) > _GATE_MAX:
            self.floor = min(above) - 1
        floor = self.floor
        while floor + 1 in above:
            floor += 1
            above.discard(floor)
        self.floor = floor
        return False


class SeenCalls:
    """The last few counted model calls of a run, as plain ints and short strings.

    A model span is the *same call* as a counted one when it has the same response id, when
    it is the parent of a counted span (a wrapper reporting the aggregate), when it is the
    child of a counted span (a library span inside our ``chat`` span), or when it is a
    *report from the other side* of a recent counted call (ours vs another instrumentation's:
    the same input and output tokens, no two different response ids; one under the same parent
    span is preferred). The last rule is for spans that reach the guard without passing the
    SDK's in-process matching (the application's own pipeline delivers them,
    ``span_export="none"``): OpenInference's LLM span has no response id, and it sits next to
    the SDK's model span under the step, or, when its wrapper runs outside the integration's,
    under the step before. Each counted call absorbs at most one such report, so two real
    calls with the same counts, each reported twice, still count twice. The cost: a call that
    only another instrumentation reports, with exactly the counts of a recent call of ours
    that nobody else reported, is taken for that call's report (the SDK's in-process matching
    has the same rule).
    """

    __slots__ = ("parents", "responses", "siblings", "spans")

    def __init__(self) -> None:
        self.spans: list[bytes] = []
        self.parents: list[bytes] = []
        self.responses: list[str] = []
        # counted calls that can still absorb one report from the other side:
        # (parent span id, input tokens, output tokens, foreign, response id)
        self.siblings: list[tuple[bytes, int, int, bool, str]] = []

    def duplicate(
        self,
        span_id: bytes,
        parent_span_id: bytes,
        response_id: str,
        counts: tuple[int, int] = (-1, -1),
        foreign: bool = True,
    ) -> bool:
        """Whether this model span is a call already counted; a sibling it matches is used up."""
        if response_id and response_id in self.responses:
            return True
        if span_id and span_id in self.parents:
            return True
        if parent_span_id and parent_span_id in self.spans:
            return True
        match = -1
        for i, (parent, inp, out, side, resp) in enumerate(self.siblings):
            if (
                side is not foreign
                and (inp, out) == counts
                and not (resp and response_id and resp != response_id)
            ):
                match = i
                if parent == parent_span_id:
                    break  # the same parent: the best match
        if match >= 0:
            del self.siblings[match]
            return True
        return False

    def sibling(self, parent_span_id: bytes, counts: tuple[int, int], foreign: bool, resp: str):
        """Remember a counted call that a report from the other side may repeat."""
        self.siblings.append((parent_span_id, counts[0], counts[1], foreign, resp))
        if len(self.siblings) > _SEEN_CAP:
            del self.siblings[0]

    def add(self, span_id: bytes, parent_span_id: bytes, response_id: str) -> None:
        rings: tuple[tuple[list[Any], bytes | str], ...] = (
            (self.spans, span_id),
            (self.parents, parent_span_id),
            (self.responses, response_id),
        )
        for ring, value in rings:
            if value:
                ring.append(value)
                if len(ring) > _SEEN_CAP:
                    del ring[0]


class RunState:
    """Everything the guard tracks for one live run."""

    __slots__ = (
        "admitted",
        "agent",
        "budget",
        "detached_at",
        "detector",
        "end_hint",
        "forecast_warned",
        "forecaster",
        "gate_cost_usd",
        "gate_tokens",
        "last_action_hash",
        "last_step",
        "last_step_cost",
        "last_step_tokens",
        "last_tool",
        "loop_warned",
        "model",
        "parent",
        "parent_run_id",
        "paused",
        "remote",
        "run_id",
        "seen",
        "seq_gate",
        "session",
        "soft",
        "started_at",
        "step_cost",
        "step_input_tokens",
        "step_tokens",
        "step_tools",
        "stop_by",
        "stop_detail",
        "stop_reason",
        "tenant",
        "touched_at",
        "trace_id",
    )

    def __init__(
        self,
        run_id: str,
        *,
        tenant: str,
        agent: str,
        parent_run_id: str,
        trace_id: bytes,
        started_at: float,
        budget: Any,
        detector: Any,
        forecaster: Any,
        soft: Any,
        session: Any = None,
        parent: RunState | None = None,
        admitted: bool = True,
        now: float = 0.0,
    ) -> None:
        self.run_id = run_id
        self.tenant = tenant
        self.agent = agent
        self.parent_run_id = parent_run_id
        self.parent = parent
        self.trace_id = trace_id
        self.started_at = started_at  # Unix seconds
        self.budget = budget
        self.detector = detector  # the LoopDetector
        self.forecaster = forecaster
        self.soft = soft
        self.session = session  # AgentSession or None (span-only or detached)
        self.admitted = admitted  # counted in the tenant's concurrency
        self.detached_at: float | None = None  # monotonic time the agent stream dropped
        self.touched_at = now  # monotonic time of the last span or heartbeat
        self.paused = False
        self.seen: SeenCalls | None = None
        self.step_input_tokens = 0
        self.step_tools = 0
        self.last_step = 0
        # Cheap running totals, only for the forecast gate (is a forecast worth computing?).
        # The budget holds the real usage; these never decide a stop.
        self.gate_tokens = 0
        self.gate_cost_usd = 0.0
        self.step_tokens = 0
        self.step_cost = 0.0
        self.last_step_tokens = 0
        self.last_step_cost = 0.0
        self.model = ""
        self.last_tool: str | None = None
        self.last_action_hash: str | None = None
        self.stop_reason: Any = None  # Reason once the guard or an operator stopped it
        self.stop_detail = ""
        self.stop_by: Any = None  # DecidedBy
        self.loop_warned = False
        self.forecast_warned = False
        # Spans numbered by the SDK (guard.seq), see _rejoin.Rejoin._gate: None = count every
        # span; a SeqGate = a re-registered run (spans numbered <= the snapshot's span_seq are
        # in the restored usage; each later one counts once); a list = *provisional*: an
        # implicit run whose agent has a control stream and has not (re-)registered it yet;
        # its spans wait there, uncounted, until it does.
        self.seq_gate: SeqGate | list[Any] | None = None
        # (status, reason) from the run span of a run that waits for its agent: the record
        # written if the agent does not come back within agent_grace_s (else agent_lost).
        self.end_hint: tuple[Any, Any] | None = None
        # The replica holding this run's control stream when it is not this one (several
        # replicas: its spans come here, its stream is there). Such a run is counted and
        # decided here, its decisions go to that replica, and its record is that replica's.
        self.remote: str | None = None

    @property
    def connected(self) -> bool:
        return self.session is not None and self.detached_at is None

    @property
    def provisional(self) -> bool:
        """Created from numbered spans before its agent (re-)registered it."""
        return type(self.seq_gate) is list

    @property
    def stopping(self) -> bool:
        return self.stop_reason is not None

    def seen_calls(self) -> SeenCalls:
        if self.seen is None:
            self.seen = SeenCalls()
        return self.seen
