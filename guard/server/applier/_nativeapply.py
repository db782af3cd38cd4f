"""The native span applier (``_applynative.c``), configured from the schema, the span host's
types and the policy's record kernels (:mod:`guard.policy._kernels`).

:func:`applier` returns the C functions: ``apply(observations, start, touched, spent, runs,
scope)`` applies spans from ``start`` exactly as the Python loop of
:class:`~guard.server.applier._applier.SpanApplier` does and returns the index of the first span it
does not answer for (see the C file's header); ``flush(touched, spent)`` is
:func:`~guard.server.applier._host.flush`; ``conclude(touched, now, decide)`` sets each touched
run's ``touched_at`` and calls ``decide(run, entry)`` (``SpanApplier._decide``) for the runs,
in order, for which it would do anything. ``None`` when the extension is not built or the
policy's native paths are off (``OTEL_GUARD_PURE_PYTHON=1``: the Python loop alone).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

from guard.policy import Phase, Usage
from guard.policy._kernels import CONTINUE_VERDICT, record_kernels
from guard.server.applier._host import Touched
from guard.server.decisions._router import FORECAST_HORIZON_STEPS
from guard.server.decode import _schema as s
from guard.server.runs._state import RunState

__all__ = ["NativeApplier", "applier", "available"]


class NativeApplier(NamedTuple):
    """The functions of ``_applynative.c`` the applier calls: the one declaration of their
    types (``configure`` is called here only)."""

    apply: Callable[..., int]
    flush: Callable[[dict[Any, Any], dict[str, Any]], None]
    conclude: Callable[[dict[Any, Any], float, Callable[[Any, Any], None]], None]


_NATIVE: ModuleType | None
try:
    _NATIVE = importlib.import_module("guard.server.applier._applynative")
except ImportError:  # pragma: no cover - installed without a C compiler
    _NATIVE = None

_configured: tuple[Any, ...] | None = None
_FUNCTIONS = (
    None if _NATIVE is None else NativeApplier(_NATIVE.apply, _NATIVE.flush, _NATIVE.conclude)
)


def available() -> bool:
    """Whether the native applier runs (built, and the policy's native paths are on)."""
    return _NATIVE is not None and record_kernels() is not None


def applier() -> NativeApplier | None:
    """The native applier, or ``None`` (not built, or the policy's native paths are off)."""
    global _configured
    kernels = record_kernels()
    if _NATIVE is None or kernels is None:
        return None
    if _configured is not kernels:  # the kernels are fixed per process: configured once
        _NATIVE.configure(
            RunState,
            Touched,
            Usage,
            (s.RUN_ID, s.KIND, s.IN, s.OUT, s.CACHED, s.REASONING, s.COST, s.MODEL, s.RESP_ID,
             s.FOREIGN, s.ACTION_FP, s.RESULT_HASH, s.ATTEMPTS, s.TOOL_NAME, s.STEP_INDEX,
             s.PROGRESS, s.STATE_HASH),
            s.NSLOTS,
            (s.KIND_TOOL, s.KIND_STEP, s.KIND_MODEL, s.KIND_RUN),
            (Phase.AFTER_MODEL_CALL, Phase.AFTER_TOOL_BATCH, Phase.BEFORE_STEP),
            tuple(kernels),
            CONTINUE_VERDICT,
            FORECAST_HORIZON_STEPS + 2,  # the look-ahead of _decisions._forecast_due
        )  # fmt: skip
        _configured = kernels
    return _FUNCTIONS
