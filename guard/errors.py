"""The one error tree of otel-guard.

Every error the project raises derives from :class:`GuardError`. Messages carry the numbers
("max_steps 12 reached (steps=12)"). gRPC status codes are mapped at one boundary
(``guard.server``), never scattered through the code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from guard.policy import Outcome

__all__ = [
    "AuthError",
    "BudgetExceeded",
    "ConfigError",
    "GuardError",
    "GuardUnavailable",
    "InputTooLarge",
    "InvalidInput",
    "RunStopped",
    "StateUnavailable",
    "StoreError",
]


class GuardError(Exception):
    """Base class of every otel-guard error."""


class ConfigError(GuardError, ValueError):
    """A settings object or policy file is invalid. ``path`` names the offending key."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


class InvalidInput(GuardError, ValueError):
    """Bad input from a caller or the wire: negative or NaN counters, missing ids, bad spans."""


class InputTooLarge(InvalidInput):
    """An input over a size bound (an id, a text, the runs in one message)."""


class BudgetExceeded(GuardError):
    """A reservation could not be granted because it would oversell a budget."""

    def __init__(self, message: str, *, metric: str, requested: float, available: float) -> None:
        self.metric = metric
        self.requested = requested
        self.available = available
        super().__init__(message)


class AuthError(GuardError):
    """A token is missing, wrong, or not allowed to do what it asked."""


class GuardUnavailable(GuardError):
    """The guard could not be reached (only raised to the user with ``fail_closed=True``)."""


class StateUnavailable(GuardUnavailable):
    """The shared state of the replicas (Redis) did not answer in time or refused a call.

    The caller falls back to its local state (fail-open) or denies (``fail_closed``); what the
    failed call did is unknown (it may have been applied before the connection broke).
    """


class StoreError(GuardError):
    """The ClickHouse store failed in a way the writer cannot absorb by spooling."""


class RunStopped(GuardError):
    """Raised out of a ``@guard.run`` function when the run is stopped.

    ``outcome`` (a :class:`guard.Outcome`) carries the status, the reason and every counter.
    """

    def __init__(self, outcome: Outcome, message: str | None = None) -> None:
        self.outcome = outcome
        super().__init__(message or getattr(outcome, "message", "") or str(outcome))

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across processes
        return (type(self), (self.outcome, str(self)))
