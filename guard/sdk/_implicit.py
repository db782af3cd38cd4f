"""Implicit estimates: what a step or a paid tool call holds when nothing was reserved for it.

A step whose model call is recorded after the fact, or a paid tool priced only once it ran,
would reserve nothing: 8 threads of one run could all pass the budget check, then all spend.
So (unless the run's limits say ``implicit_estimates: false``) such a step holds while it
runs the run's mean cost and tokens per step so far, and such a tool call the run's mean
cost per call of that tool: through the same budget lock and tenant check as
``step.reserve``, settled by the step's model call, released otherwise. A refusal stops the
run before the call, its message naming the estimate. No mean yet: nothing is held, so the
first calls are never refused; the steps open when the first mean appears then hold it too
(never refused: their calls are under way). Parallel callers so overshoot by the estimate's
error, not by a call each. An explicit reservation wins: entering one frees the implicit
estimate of its context, and the run's later steps are left to their own estimates.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import TYPE_CHECKING, Any

from guard.errors import BudgetExceeded
from guard.sdk._reserve import (
    HeldEstimate,
    budget_stop,
    current_reservation,
    tenant_check,
    tenant_check_async,
)

if TYPE_CHECKING:  # pragma: no cover
    from guard.policy import Reservation
    from guard.sdk._run import LiveRun

__all__ = [
    "ImplicitReservation",
    "Means",
    "end_step",
    "hold_step",
    "hold_step_async",
    "note_call",
    "tool_estimate",
]

log = logging.getLogger("guard.sdk")
_MAX_TOOLS = 1024  # tool names come from code, but a bound keeps a run's memory fixed


class Means:
    """One run's running means: cost_usd and tokens per step (over the steps that made a
    model call; cost over the priced ones), and cost_usd per call of each tool (over the
    calls that recorded a cost). Thread-safe."""

    __slots__ = (
        "_lock",
        "explicit",
        "pending",
        "step_cost_n",
        "step_cost_usd",
        "step_n",
        "step_tokens",
        "tools",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.explicit = False  # the run reserved explicitly: its steps are left to that
        self.pending: set[Any] = set()  # open steps that began before any mean was known
        self.step_n = 0
        self.step_tokens = 0
        self.step_cost_n = 0
        self.step_cost_usd = 0.0
        self.tools: dict[str, list[float]] = {}  # name -> [calls with a cost, their total]

    def end_step(self, step: Any) -> None:
        """``step`` ended: its spend joins the mean. The first mean is also held, from now
        on, by the steps that began before it and have not recorded a call yet (their calls
        are under way: never refused, only kept from being sold twice)."""
        with self._lock:
            self.pending.discard(step)
            imp, spent = step._implicit, step._spent
            step._implicit = step._spent = None
            if spent is not None:
                first = not self.step_n
                self.step_n += 1
                self.step_tokens += spent[1]
                if spent[0] is not None:
                    self.step_cost_n += 1
                    self.step_cost_usd += spent[0]
                if first and self.pending:
                    self._fill_locked(step.run)
        if imp is not None:
            imp.close()

    def _fill_locked(self, run: LiveRun) -> None:
        cost_usd, tokens, _ = self._mean_locked()
        for step in () if self.explicit or not (cost_usd or tokens) else self.pending:
            if step._spent is not None or step._implicit is not None:
                continue  # its call is recorded already
            try:  # the budget's lock inside this one (never the other way round)
                res = run.budget.reserve(tokens=tokens, cost_usd=cost_usd)
            except BudgetExceeded:
                continue  # what is in flight is never refused
            # settled by the step's model call (it looks at its own hold too), else released
            step._implicit = ImplicitReservation(run, res, cost_usd, tokens, current=False)
        # emptied last: a step leaving meanwhile sees itself pending or its hold (Step.__exit__)
        self.pending = set()

    def _mean_locked(self) -> tuple[float, int, int]:
        n, cn = self.step_n, self.step_cost_n
        cost = self.step_cost_usd / cn if cn else 0.0
        return cost, (round(self.step_tokens / n) if n else 0), n

    def step_mean(self, step: Any) -> tuple[float, int, int]:
        """``(cost_usd, tokens, steps)``: the mean per step and how many steps it is over;
        before the first, ``step`` waits in :attr:`pending` for it."""
        with self._lock:
            if not self.step_n:
                self.pending.add(step)
            return self._mean_locked()

    def add_tool(self, name: str, cost_usd: float) -> None:
        with self._lock:
            m = self.tools.get(name)
            if m is None:
                if len(self.tools) >= _MAX_TOOLS:
                    return
                m = self.tools[name] = [0.0, 0.0]
            m[0] += 1
            m[1] += cost_usd

    def tool_mean(self, name: str) -> tuple[float, int] | None:
        """``(cost_usd, calls)`` of the tool, or ``None`` before its first priced call."""
        with self._lock:
            m = self.tools.get(name)
            return None if m is None or not m[0] else (m[1] / m[0], int(m[0]))

    def explicit_reservation(self, run: LiveRun) -> None:
        """An explicit reservation of ``run`` is being entered in this context: the implicit
        estimate held here is freed first (explicit wins), and the run's later steps hold
        none (see the module's docstring)."""
        self.explicit = True
        held = current_reservation.get()
        if isinstance(held, ImplicitReservation) and held.run is run:
            held.close()


class ImplicitReservation(HeldEstimate):
    """The estimate a step holds: settled by a model call of its context (``take``, as a
    ``step.reserve`` block's is), released when the step ends. Never raises on close."""

    __slots__ = ()

    def __init__(
        self, run: LiveRun, res: Reservation, cost_usd: float, tokens: int, *, current: bool = True
    ) -> None:
        super().__init__(run, cost_usd, tokens, res)
        if current:  # this context's reservation (the step's own, set when it is entered)
            self._token = current_reservation.set(self)

    def close(self) -> None:
        """No longer this context's reservation; the estimate is freed unless settled."""
        token, self._token = self._token, None
        if token is not None:
            # left in another context (a generator): the contextvar is that context's
            with contextlib.suppress(ValueError, RuntimeError):
                current_reservation.reset(token)
        res, self._res = self._res, None
        self.settled = True  # a later model call of this step records without it
        if res is not None:
            res.release()  # a no-op once settled


def _limited(run: LiveRun) -> bool:
    """Whether a hold can matter: a cost or token limit on the lineage, or a tenant
    allowance to keep (else it would only take the budget's lock for nothing)."""
    if run.root.allowance is not None:
        return True
    r: LiveRun | None = run
    while r is not None:
        lim = r.budget.limits
        if lim.max_cost_usd is not None or lim.max_tokens is not None:
            return True
        r = r.parent
    return False


def _step_hold(step: Any) -> ImplicitReservation | None:
    run: LiveRun = step.run
    means: Means = run.means
    if means.explicit or not run.limits.implicit_estimates or not _limited(run):
        return None
    held = current_reservation.get()
    if held is not None and held.run is run and not isinstance(held, ImplicitReservation):
        return None  # an explicit reservation of this run is active around the step
    cost_usd, tokens, n = means.step_mean(step)
    if not cost_usd and not tokens:
        return None
    try:
        res = run.budget.reserve(tokens=tokens, cost_usd=cost_usd)
    except BudgetExceeded as exc:
        what = ", ".join(
            ([f"{cost_usd:g} cost_usd"] if cost_usd else [])
            + ([f"{tokens} tokens"] if tokens else [])
        )
        steps = "1 step" if n == 1 else f"{n} steps"
        budget_stop(run, exc, f"implicit estimate {what} (the run's mean per step, over {steps})")
        raise  # pragma: no cover - budget_stop raised
    return ImplicitReservation(run, res, cost_usd, tokens)


def hold_step(step: Any) -> ImplicitReservation | None:
    """On entering ``step``: hold its run's mean per step (``None``: nothing held). Raises
    ``RunStopped`` when the run's budget or its tenant cannot cover it."""
    imp = _step_hold(step)
    if imp is not None:
        tenant_check(step.run, imp.close)
    return imp


async def hold_step_async(step: Any) -> ImplicitReservation | None:
    """:func:`hold_step` without blocking the event loop on the tenant check."""
    imp = _step_hold(step)
    if imp is not None:
        await tenant_check_async(step.run, imp.close)
    return imp


def note_call(step: Any, cost_usd: float | None, tokens: int) -> None:
    """A model call counted in ``step``: its usage goes into the step's spend (``None`` cost:
    unpriced, the step's cost stays what its priced calls made)."""
    spent = step._spent
    if spent is None:
        step._spent = (cost_usd, tokens)
    else:
        cost = spent[0] if cost_usd is None else (spent[0] or 0.0) + cost_usd
        step._spent = (cost, spent[1] + tokens)


def end_step(step: Any) -> None:
    """On leaving a step: release its unsettled estimate and count its spend in the run's
    means. Never raises (telemetry bookkeeping must not fail the agent)."""
    try:
        step.run.means.end_step(step)
    except Exception:  # pragma: no cover - defensive
        log.debug("otel-guard: implicit estimate bookkeeping failed", exc_info=True)


def tool_estimate(run: LiveRun, name: str) -> tuple[float, str] | None:
    """A paid tool call priced by nothing explicit: ``(cost_usd, what)``, the run's mean cost
    per call of ``name`` and the words for a refusal; ``None`` before its first priced call
    (or with implicit estimates off)."""
    if not run.means.tools or not run.limits.implicit_estimates:
        return None
    mean = run.means.tool_mean(name)
    if mean is None:
        return None
    cost_usd, n = mean
    calls = "1 call" if n == 1 else f"{n} calls"
    return cost_usd, (
        f"implicit estimate {cost_usd:g} cost_usd (the run's mean per call of {name!r}, "
        f"over {calls})"
    )
