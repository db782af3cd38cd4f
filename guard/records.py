"""Records the guard hands to a sink: pure data, next to :class:`~guard.policy.Outcome`.

:class:`DecisionRecord` (one row of ``otel_guard.decisions``) and the :class:`RecordSink`
protocol live here, outside ``guard.store``, so the server (and anything that only produces
records) does not load the store or ClickHouse; ``guard.store`` re-exports both and owns
their table mapping.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol

from guard.policy._types import Outcome

__all__ = ["DecisionRecord", "RecordSink"]


@dataclass(slots=True)
class DecisionRecord:
    """One warn, wrap_up, cancel or deny the guard issued (one row of ``otel_guard.decisions``).

    ``delivery_latency_ms`` is command sent -> ack received; ``None`` when never acked
    (the agent was gone, or the command was not deliverable).
    """

    decided_at: float  # Unix seconds
    run_id: str
    tenant: str
    agent: str
    action: str  # warn | wrap_up | cancel | deny
    reason: str  # a stop-taxonomy reason
    detail: str = ""
    utilisation: float | None = None
    metric: str | None = None
    command_id: int = 0
    decided_by: str = "guard"  # guard | operator
    delivery_latency_ms: float | None = None
    guard_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class RecordSink(Protocol):
    """Where the guard sends termination and decision records. Must never block.

    ``write_run`` returns once the record is durable; it raises ``StoreError`` when it could
    not make it so (a full disk), and the guard then does not acknowledge the record (its
    agent keeps it, the guard offers it again). ``write_decision`` never raises."""

    def write_run(self, outcome: Outcome) -> None: ...

    def write_decision(self, record: DecisionRecord) -> None: ...

    # Optional: ``dead_letter(table, run_id, error, raw)`` keeps a record the guard refused
    # (raw text and reason). A sink without it gets one WARNING line per refused record.
