"""The policy's record kernels (``_speedups.c``): its per-span arithmetic, for the guard's
native span applier (``guard/server/applier/_applynative.c``).

Each kernel does what one method does, on that method's own object, and returns ``None``
(having changed nothing) where the method must run instead:

==========================================  ================================================
``budget_step(budget, also)``               ``budget.record_step()``; ``also.steps += 1``
``budget_model_call(budget, also, i, o,     ``budget.record_model_call(...)`` of plain counts
r, c, cost)``                               and cost; the same usage added to ``also``
``budget_tool_calls(budget, also, n, a)``   ``budget.record_tool_calls(n, attempts=a)``; the
                                            same calls added to ``also``
``budget_quiet(budget, rank)``               True: ``budget.escalation(above=...)`` without a
                                            loop verdict is None for certain
``loop_observe(detector, action, result)``  ``detector.observe_action()``'s first half: True
                                            = CONTINUE, False = finish with ``judge_last()``
``loop_end_step(detector, state, prog.)``   ``detector.end_step()`` of a silent step or one
                                            with progress and no state
``forecast_observe(f, index, tokens)``      ``f.observe(index, tokens)`` of valid values
==========================================  ================================================

``also`` is a :class:`~guard.policy.Usage` summing a request's spend per tenant. The
kernels are bound to the classes below at import; tests/policy/test_policy_kernels.py holds
each to its method.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from guard.policy._budget import Budget
from guard.policy._fingerprint import _BUILT, native_module
from guard.policy._forecast import Forecaster
from guard.policy._loops import _OK, LoopDetector, LoopVerdict
from guard.policy._types import Usage

__all__ = ["CONTINUE_VERDICT", "RecordKernels", "record_kernels"]


class RecordKernels(NamedTuple):
    """The kernels (see the module's table), in the order the native applier takes them."""

    budget_step: Any
    budget_model_call: Any
    budget_tool_calls: Any
    budget_quiet: Any
    loop_observe: Any
    loop_end_step: Any
    forecast_observe: Any


_KERNELS: RecordKernels | None = None
if _BUILT is not None and hasattr(_BUILT, "bind"):
    _BUILT.bind(Budget, Usage, LoopDetector, Forecaster, _OK)
    _KERNELS = RecordKernels(
        _BUILT.budget_step,
        _BUILT.budget_model_call,
        _BUILT.budget_tool_calls,
        _BUILT.budget_quiet,
        _BUILT.loop_observe,
        _BUILT.loop_end_step,
        _BUILT.forecast_observe,
    )

#: The verdict ``loop_observe`` means by True and ``loop_end_step`` returns for a quiet step.
CONTINUE_VERDICT: LoopVerdict = _OK


def record_kernels() -> RecordKernels | None:
    """The kernels, or ``None`` when the native paths are not built or are turned off
    (:func:`~guard.policy.use_native`)."""
    if _KERNELS is None or native_module() is None:
        return None
    return _KERNELS
