"""What agent code sees of its run: ``guard.current_run()`` inside a ``@guard.run``.

The live run behind it (:class:`~guard.sdk._run.LiveRun`) also carries the SDK's own machinery
(the budget, the loop detector, the stop state machine, the span); that stays private, so this
surface can stay the same while the machinery changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from guard.policy import Limits, Outcome, Reason, Remaining, Usage
    from guard.sdk._run import LiveRun

__all__ = ["Run"]


class Run:
    """One guarded run. Obtain it with ``guard.current_run()`` inside a ``@guard.run``.

    Every method is safe from any thread or task. Outside a run, ``guard.current_run()``
    returns a falsy :class:`~guard.NullRun` with the same surface.
    """

    __slots__ = ("_live",)

    def __init__(self, live: LiveRun) -> None:
        self._live = live

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return repr(self._live)

    # -- identity ---------------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        return self._live.run_id

    @property
    def trace_id(self) -> str:
        """The run span's trace id (32 hex characters); empty when no span is recorded."""
        return self._live.trace_id

    @property
    def parent_run_id(self) -> str | None:
        """The enclosing run's id for a sub-agent, else ``None``."""
        return self._live.parent_run_id

    @property
    def agent(self) -> str:
        return self._live.agent

    @property
    def tenant(self) -> str:
        return self._live.tenant

    # -- limits and usage -------------------------------------------------------------------
    @property
    def limits(self) -> Limits:
        """The effective limits (decorator, tightened by the guard's admit)."""
        return self._live.limits

    def usage(self) -> Usage:
        """What the run has used so far: steps, tokens, cost_usd, tool_calls, model_calls."""
        return self._live.usage()

    def remaining(self) -> Remaining:
        """What is left: seconds, steps, tokens, cost_usd, tool_calls (``None`` = unlimited)."""
        return self._live.remaining()

    def timeout(self, configured_s: float | None = None) -> float | None:
        """``min(configured_s, remaining time - safety margin)``: use for every I/O timeout."""
        return self._live.timeout(configured_s)

    def elapsed_s(self) -> float:
        """Seconds since the run started."""
        return self._live.elapsed_s()

    # -- stopping ---------------------------------------------------------------------------
    @property
    def cancelled(self) -> bool:
        """True as soon as a cancel (or deadline/guard stop) is requested, from any thread."""
        return self._live.cancelled

    @property
    def outcome(self) -> Outcome | None:
        """The run's outcome once it ended, else ``None``."""
        return self._live.outcome

    @property
    def warned(self) -> bool:
        """A soft threshold was crossed (a warn, local or from the guard)."""
        return self._live.warned

    @property
    def wrap_up_requested(self) -> bool:
        """The policy or an operator asked the agent to wrap up: finish with what it has."""
        return self._live.wrap_up_requested

    def raise_if_cancelled(self) -> None:
        """Raise ``RunStopped`` if the run was cancelled or must stop (a cheap check)."""
        self._live.raise_if_cancelled()

    def cancel(self, reason: str | Reason = "user_cancel", detail: str = "") -> bool:
        """Cancel the run from any thread or task. Returns False when it had already ended.

        ``reason`` is a stop reason (``user_cancel`` by default); free text is recorded as the
        detail of a ``user_cancel``.
        """
        return self._live.cancel(reason, detail)

    def on_cancel(self, callback: Callable[[], Any]) -> None:
        """Call ``callback()`` when the run is cancelled or stopped (runs at once if it was)."""
        self._live.on_cancel(callback)

    def on_directive(self, callback: Callable[[str, str, str], Any]) -> None:
        """Call ``callback(action, reason, detail)`` on each warn / wrap_up (local or guard)."""
        self._live.on_directive(callback)

    def track_process(self, proc: Any) -> Any:
        """Register a subprocess (Popen, asyncio Process or pid); its group dies on cancel.

        Start it with ``start_new_session=True`` so the whole process tree is one group.
        Returns ``proc`` for chaining.
        """
        return self._live.track_process(proc)

    # -- pause, evidence, partial results ---------------------------------------------------
    @property
    def paused(self) -> bool:
        return self._live.paused

    def pause(self, reason: str = "") -> None:
        """Pause for approval: not a stop. The deadline freezes if the policy says so."""
        self._live.pause(reason)

    def resume(self) -> None:
        """End a pause."""
        self._live.resume()

    def evidence(self, name: str, ok: bool = True) -> None:
        """Record evidence (e.g. ``tests_passed``) for ``require_evidence``."""
        self._live.evidence(name, ok)

    def mark_partial(self, value: bool = True) -> None:
        """Say explicitly whether a usable partial result exists if the run stops."""
        self._live.mark_partial(value)
