"""The module-level API: ``configure()``, ``current_run()``, ``evidence()``, ``flush()``,
``shutdown()``, ``stats()``; and ``reset()`` for tests. The settings (``guard.sdk._config``) and
the runtime built from them (``guard.sdk._runtime``) change together here, and only here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from guard.policy import Limits, Remaining, Usage
from guard.sdk import _runtime
from guard.sdk._config import Settings, make_settings, swap_settings
from guard.sdk._handle import Run
from guard.sdk._run import current_run_or_none

__all__ = [
    "NULL_RUN",
    "NullRun",
    "configure",
    "current_run",
    "evidence",
    "flush",
    "reset",
    "shutdown",
    "stats",
]


def configure(**kwargs: Any) -> Settings:
    """Set the process-wide SDK settings and (re)start the guard connection if any.

    Arguments override ``OTEL_GUARD_*`` environment variables, which override defaults.
    Unknown keys raise :class:`guard.errors.ConfigError`. Returns the validated settings.
    Calling it again replaces the settings (the previous exporter and control stream close).
    """
    settings = make_settings(**kwargs)
    _runtime.reset_runtime(swap_settings(settings))
    return settings


def reset() -> None:
    """Forget the settings and close the runtime (tests use this between cases)."""
    _runtime.reset_runtime(swap_settings(None))


_NO_LIMITS = Limits()


class NullRun:
    """Stands in for a run outside ``@guard.run`` (or with the SDK disabled).

    Falsy, never cancelled, unlimited: agent code written against ``guard.current_run()``
    works unchanged without a guard.
    """

    run_id = ""
    trace_id = ""
    agent = ""
    tenant = ""
    parent_run_id = None
    outcome = None
    cancelled = False
    paused = False
    warned = False
    wrap_up_requested = False

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "<guard.NullRun>"

    @property
    def limits(self) -> Limits:
        return _NO_LIMITS

    def remaining(self) -> Remaining:
        return Remaining()

    def usage(self) -> Usage:
        return Usage()

    def elapsed_s(self) -> float:
        return 0.0

    def timeout(self, configured_s: float | None = None) -> float | None:
        return configured_s

    def raise_if_cancelled(self) -> None:
        return None

    def cancel(self, reason: Any = "user_cancel", detail: str = "") -> bool:
        return False

    def on_cancel(self, callback: Callable[[], Any]) -> None:
        return None

    def on_directive(self, callback: Callable[[str, str, str], Any]) -> None:
        return None

    def track_process(self, proc: Any) -> Any:
        return proc

    def pause(self, reason: str = "") -> None:
        return None

    def resume(self) -> None:
        return None

    def evidence(self, name: str, ok: bool = True) -> None:
        return None

    def mark_partial(self, value: bool = True) -> None:
        return None


NULL_RUN = NullRun()


def current_run() -> Run | NullRun:
    """The innermost run of this context; a falsy :class:`NullRun` outside any run."""
    r = current_run_or_none()
    return r.handle if r is not None else NULL_RUN


def evidence(name: str, ok: bool = True) -> None:
    """Record evidence for ``@guard.run(require_evidence=[...])``, e.g. after the tests ran.

    A run that returns without every required evidence (or with ``ok=False``) is recorded
    as ``degraded`` / ``missing_evidence``: a claim of success is not evidence.
    """
    r = current_run_or_none()
    if r is not None:
        r.evidence(name, ok)


def flush(timeout_s: float = 5.0) -> bool:
    """Export queued spans to the guard now (e.g. before a short-lived process exits)."""
    rt = _runtime.current_runtime()
    return rt.flush(timeout_s) if rt is not None else True


def shutdown() -> None:
    """Flush and close the exporter and the control stream (idempotent)."""
    _runtime.reset_runtime()


def stats() -> dict[str, int]:
    """Export, redaction and control-stream counters (errors are counted here, never raised)."""
    return _runtime.stats()
