"""What the transports see of the running guard: the one host every servicer is given.

The OTLP receivers, ``GuardControl``, ``GuardAdmin`` and the metrics only adapt: they read
the parts :func:`~guard.server._compose.assemble` built, through this interface, and never
the server's lifecycle. :class:`~guard.server._app.GuardServer` is the implementation; the
type checker holds it to :class:`GuardHost` (:mod:`guard.server._compose`).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from guard.policy import PolicyConfig
    from guard.server.control._fanout import AgentSession
    from guard.server.otlp._intake import SpanIntake
    from guard.server.runs._registry import Registry
    from guard.server.runtime._auth import Authenticator
    from guard.server.runtime._fair import TenantTurns
    from guard.server.runtime._looplag import LoopLag

__all__ = ["GuardHost"]


class GuardHost(Protocol):
    """The running guard, as its servicers use it."""

    config: PolicyConfig
    guard_id: str  # this replica's id, in records, ListRuns and every metric series
    sink: Any  # where records go (the store, or a memory/null sink)
    registry: Registry
    auth: Authenticator
    intake: SpanIntake  # every span request of both transports
    turns: TenantTurns
    policy_pb: Any  # the policy as the agents receive it (guard.v1.Policy)
    loop_lag: LoopLag
    draining: bool  # set once, when the drain starts: new Exports and streams are refused
    export_refusals: Counter[str]  # refused Export requests, by gRPC status name

    def attach_session(self, session: AgentSession) -> None:
        """An agent's control stream opened (refused at once while draining)."""

    def detach_session(self, session: AgentSession) -> None:
        """An agent's control stream closed."""

    def figures(self) -> dict[str, float]:
        """``GuardAdmin.Stats``: the guard's counters and gauges by name."""
