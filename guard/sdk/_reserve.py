"""Reservations on the agent side: ``step.reserve(...)`` and the tenant allowance checks.

``with guard.step() as step, step.reserve(cost_usd=0.02, tokens=4_000): ...`` holds the
estimate against the run and its ancestors (``Budget.reserve``: one lock per run tree, so 8
threads reserving at once cannot oversell) and against the tenant's allowance held by the
root run, before the call. It raises ``RunStopped`` before the call when it cannot be covered:
``cost_budget`` / ``token_budget`` for the run's own limits, ``tenant_budget`` when the guard
says the tenant has nothing more to grant. A ``step.model_call(...)`` inside the block settles
it (the estimate freed and the actual recorded in one lock); leaving the block otherwise
(no call, an exception, a cancel, a timeout) releases it. A reservation is always settled.

Tenant allowance (a tenant's budget shared out to its live root runs as slices): the guard
pushes the root run ceilings on its cumulative usage (:class:`Ceilings`). A reservation that
would pass them sends an ``AllowanceRequest`` and waits at most ``admit_timeout_ms`` for the
answer. No answer, no guard, or a ttl gone by: fail-open (the call proceeds under the local
limits; counted in ``guard.stats()`` as ``control_allowance_fail_open``), or
``RunStopped(tenant_budget)`` under ``fail_closed``. Without a reservation, a model call whose
usage would not leave room for one more call of its size asks for more the same way, and an
``exhausted`` answer stops the run at its next SDK call (at most the calls already in flight
overshoot).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from guard.errors import BudgetExceeded, InvalidInput
from guard.policy import REASON_STATUS, Action, DecidedBy, Decision, Reason
from guard.policy._reservation import check_count, check_money

if TYPE_CHECKING:  # pragma: no cover
    from guard.policy import Reservation
    from guard.sdk._implicit import ImplicitReservation
    from guard.sdk._run import LiveRun

__all__ = [
    "Ceilings",
    "HeldEstimate",
    "StepReservation",
    "budget_stop",
    "current_reservation",
    "estimate_cost",
    "tenant_after_call",
    "tenant_check",
    "tenant_check_async",
    "tenant_reserve_sync",
]

log = logging.getLogger("guard.sdk")
_EPS = 1e-12
_ROUNDS = 3  # requests per reservation before giving up (each answer may grant too little)

# The reservation a model call of this context settles (each thread / task has its own).
current_reservation: contextvars.ContextVar[StepReservation | ImplicitReservation | None] = (
    contextvars.ContextVar("guard_reservation", default=None)
)


class Ceilings:
    """The tenant allowance of a root run, as last pushed by the guard (latest wins)."""

    __slots__ = ("detail", "exhausted", "expires_at", "max_cost_usd", "max_tokens")

    def __init__(
        self,
        max_cost_usd: float | None,
        max_tokens: int | None,
        ttl_s: float,
        exhausted: bool = False,
        detail: str = "",
    ) -> None:
        self.max_cost_usd = max_cost_usd
        self.max_tokens = max_tokens
        self.expires_at = time.monotonic() + max(0.0, ttl_s)
        self.exhausted = exhausted
        self.detail = detail

    def need(self, cost_usd: float, tokens: int) -> tuple[float, int]:
        """How much more than these ceilings ``cost_usd`` / ``tokens`` (cumulative) need."""
        nc = 0.0 if self.max_cost_usd is None else max(0.0, cost_usd - self.max_cost_usd)
        nt = 0 if self.max_tokens is None else max(0, tokens - self.max_tokens)
        return (nc if nc > _EPS else 0.0, nt)


def estimate_cost(
    run: LiveRun, model: str | None, input_tokens: int, output_tokens: int | None = None
) -> float:
    """An upper-bound cost of a call of ``model`` from the price book: ``input_tokens`` at its
    input rate and ``output_tokens`` at its output rate (an estimate assumes no cache hit, so
    never the cached rate). ``output_tokens=None``: ``input_tokens`` is a total whose split is
    unknown, every token at the dearer of the two rates. 0.0 when the model is unpriced."""
    if not model or not (input_tokens or output_tokens):
        return 0.0
    p = run.rt.price_book.price(model) if hasattr(run.rt.price_book, "price") else None
    if p is None:
        return 0.0
    if output_tokens is None:
        return input_tokens * max(p.input, p.output) / 1e6
    return (input_tokens * p.input + output_tokens * p.output) / 1e6


def _stop(
    run: LiveRun, reason: Reason, message: str, metric: str | None = None, by: Any = None
) -> None:
    """Raise ``RunStopped`` now; the run stays stopped (its next SDK call raises too)."""
    d = Decision(Action.STOP, REASON_STATUS[reason], reason, None, metric, message)
    if by is None:
        run.apply(d, raise_now=True)
    run.apply(d, raise_now=False)
    run.raise_stop(d, by)


def budget_stop(run: LiveRun, exc: BudgetExceeded, context: str = "") -> None:
    """Stop the run with the reason of the budget that refused a reservation; ``context``
    says what was refused, ahead of the budget's own numbers."""
    reason = Reason.TOKEN_BUDGET if exc.metric == "tokens" else Reason.COST_BUDGET
    if exc.metric == "tool_calls":
        reason = Reason.MAX_TOOL_CALLS
    prefix = f"{context}: " if context else ""
    _stop(run, reason, f"{prefix}reservation refused: {exc}", exc.metric)


# -- the tenant check ------------------------------------------------------------------------
def _tenant_needs(run: LiveRun) -> tuple[Ceilings, float, int] | None:
    """What the root run's used + reserved needs beyond its ceilings (``None``: it fits, or
    there are no ceilings to keep)."""
    al = run.root.allowance
    if al is None:
        return None
    cost, tokens = run.root.budget.held()
    nc, nt = al.need(cost, tokens)
    if not nc and not nt:
        return None
    return al, nc, nt


def _fallback(run: LiveRun, why: str) -> None:
    """No usable answer from the guard: fail-open (counted), or refuse under fail_closed."""
    counters = run.rt.control.counters if run.rt.control is not None else None
    if run.fail_closed:
        if counters is not None:
            counters["allowance_refused"] += 1
        _stop(run, Reason.TENANT_BUDGET, f"tenant allowance unavailable ({why}; fail_closed)")
    if counters is not None:
        counters["allowance_fail_open"] += 1
        if counters["allowance_fail_open"] == 1:
            log.warning("otel-guard: tenant allowance unavailable (%s); local limits only", why)


def _ask(
    run: LiveRun, nc: float, nt: int, *, stop: bool = False
) -> concurrent.futures.Future[Any] | None:
    control = run.rt.control
    if control is None:
        return None
    return control.allowances.request(run.root, nc, nt, stop_if_exhausted=stop)


def _answered(run: LiveRun, answer: Any) -> bool:
    """After an answer: ``True`` to check again; raises when the tenant is exhausted."""
    if answer is None or time.monotonic() >= answer.expires_at:
        _fallback(run, "no allowance from the guard" if answer is None else "allowance expired")
        return False
    if answer.exhausted:  # the guard's word: decided by the guard
        _stop(run, Reason.TENANT_BUDGET, answer.detail or "tenant exhausted", by=DecidedBy.GUARD)
    return True


def _rounds(run: LiveRun) -> Any:
    """The tenant check as a generator: it yields the future of each request (or ``None``)
    and is sent the answer, so the sync and async drivers only differ in how they wait."""
    for _ in range(_ROUNDS):
        needs = _tenant_needs(run)
        if needs is None:
            return
        al, nc, nt = needs
        if time.monotonic() >= al.expires_at:
            _fallback(run, "allowance expired")
            return
        answer = yield _ask(run, nc, nt)
        if not _answered(run, answer):
            return
    if _tenant_needs(run) is not None:
        _stop(run, Reason.TENANT_BUDGET, "tenant allowance: the guard granted too little")


def _wait(fut: concurrent.futures.Future[Any] | None, timeout_s: float) -> Any:
    if fut is None:
        return None
    try:
        return fut.result(timeout=timeout_s)
    except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
        fut.cancel()  # nobody waits any more: the control client forgets it
        return None


async def _await(fut: concurrent.futures.Future[Any] | None, timeout_s: float) -> Any:
    if fut is None:
        return None
    with contextlib.suppress(TimeoutError):
        return await asyncio.wait_for(asyncio.wrap_future(fut), timeout_s)
    return None


def tenant_reserve_sync(run: LiveRun, timeout_s: float) -> None:
    """Make the root's allowance cover what the run tree holds now (its reservation
    included), asking the guard for more when it does not; raises ``RunStopped``."""
    gen, answer = _rounds(run), None
    with contextlib.suppress(StopIteration):
        while True:  # send(None) first starts the generator
            answer = _wait(gen.send(answer), timeout_s)


async def tenant_reserve_async(run: LiveRun, timeout_s: float) -> None:
    """:func:`tenant_reserve_sync` without blocking the event loop."""
    gen, answer = _rounds(run), None
    with contextlib.suppress(StopIteration):
        while True:
            answer = await _await(gen.send(answer), timeout_s)


def tenant_check(run: LiveRun, undo: Callable[[], None]) -> None:
    """The tenant check of a hold just taken on ``run`` (:func:`tenant_reserve_sync`, waiting
    at most the admit timeout); any exception (a stop included) gives the hold back first."""
    try:
        tenant_reserve_sync(run, run.rt.settings.admit_timeout_ms / 1000.0)
    except BaseException:
        undo()
        raise


async def tenant_check_async(run: LiveRun, undo: Callable[[], None]) -> None:
    """:func:`tenant_check` without blocking the event loop."""
    try:
        await tenant_reserve_async(run, run.rt.settings.admit_timeout_ms / 1000.0)
    except BaseException:
        undo()
        raise


def tenant_after_call(run: LiveRun, al: Ceilings, cost_usd: float | None, tokens: int) -> None:
    """After a model call made without a reservation: when one more call of this size would
    pass the allowance, ask for more now; ``exhausted`` makes the stop pending (raised at
    the run's next SDK call, the finished call's result is kept). Never raises."""
    root = run.root
    held_cost, held_tokens = root.budget.held()
    nc, nt = al.need(held_cost + (cost_usd or 0.0), held_tokens + tokens)
    if not nc and not nt:
        return
    if time.monotonic() >= al.expires_at:
        return
    fut = _ask(run, nc, nt, stop=True)
    if fut is None:
        return
    # On an event loop's thread a sync wait would stall the loop: the answer then applies
    # when it arrives (the control thread makes the stop pending).
    timeout_s = (
        0.0
        if asyncio._get_running_loop() is not None
        else run.rt.settings.admit_timeout_ms / 1000.0
    )
    try:
        answer = fut.result(timeout=timeout_s) if timeout_s > 0 else None
    except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
        answer = None
    if answer is not None and answer.exhausted:
        pending_tenant_stop(run, answer.detail)


def pending_tenant_stop(run: LiveRun, detail: str) -> None:
    """The guard said exhausted: the run stops at its next SDK call (decided by the guard,
    as its tenant cut would; no task cancel, so the finished call's result is kept)."""
    run.interrupt(
        Reason.TENANT_BUDGET, detail or "tenant budget exhausted", DecidedBy.GUARD, cancel=False
    )


# -- step.reserve ----------------------------------------------------------------------------
class HeldEstimate:
    """An estimate a model call of its context settles (:data:`current_reservation`): what
    ``step.reserve`` and a step's implicit estimate (``_implicit``) share. ``_res`` is the
    budget reservation, ``_token`` the context variable's while it is the current one."""

    __slots__ = ("_res", "_token", "cost_usd", "run", "settled", "tokens")

    def __init__(
        self, run: LiveRun | None, cost_usd: float, tokens: int, res: Reservation | None = None
    ) -> None:
        self.run = run
        self.cost_usd = cost_usd
        self.tokens = tokens
        self.settled = False
        self._res: Reservation | None = res
        self._token: Any = None

    def take(self) -> Reservation | None:
        """For the model call that settles it (once): the budget reservation."""
        if self.settled:
            return None
        self.settled = True
        return self._res


class StepReservation(HeldEstimate):
    """``step.reserve(...)``: an estimate held from entering the block until a model call
    settles it or the block is left (then released). Sync and async context manager."""

    __slots__ = ()

    def _hold(self) -> LiveRun | None:
        run = self.run
        if run is None:
            return None
        run.check_stop()
        run.means.explicit_reservation(run)  # explicit wins over an implicit estimate
        try:
            self._res = run.budget.reserve(tokens=self.tokens, cost_usd=self.cost_usd)
        except BudgetExceeded as exc:
            budget_stop(run, exc)
        return run

    def __enter__(self) -> StepReservation:
        run = self._hold()
        if run is not None:
            tenant_check(run, self._release)
            self._token = current_reservation.set(self)
        return self

    async def __aenter__(self) -> StepReservation:
        run = self._hold()
        if run is not None:
            await tenant_check_async(run, self._release)
            self._token = current_reservation.set(self)
        return self

    def _release(self) -> None:
        res, self._res = self._res, None
        if res is not None:
            res.release()  # a no-op once settled

    def __exit__(self, *exc: Any) -> None:
        if self._token is not None:
            # left in another context: the contextvar is that context's
            with contextlib.suppress(ValueError):
                current_reservation.reset(self._token)
            self._token = None
        self._release()

    async def __aexit__(self, *exc: Any) -> None:
        self.__exit__(*exc)


def make_reservation(
    run: LiveRun | None,
    cost_usd: float | None,
    tokens: int | None,
    model: str | None,
    *,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
) -> StepReservation:
    """Validate the estimate: ``tokens`` (a total), or its split ``input_tokens`` /
    ``output_tokens`` (either may be left out), never both. Without ``cost_usd``, ``model=``
    prices it: a split at the model's input and output rates, a total at the dearer one."""
    split = input_tokens is not None or output_tokens is not None
    if tokens is not None and split:
        raise InvalidInput(
            f"step.reserve: give tokens={tokens!r} or input_tokens={input_tokens!r} / "
            f"output_tokens={output_tokens!r}, not both (tokens is their total)"
        )
    if split:
        in_t = 0 if input_tokens is None else check_count("input_tokens", input_tokens)
        out_t = 0 if output_tokens is None else check_count("output_tokens", output_tokens)
        total = in_t + out_t
    else:
        total = 0 if tokens is None else check_count("tokens", tokens)
    if cost_usd is not None:
        cost = check_money("cost_usd", cost_usd)
    elif run is None:
        cost = 0.0
    else:
        cost = estimate_cost(run, model, in_t, out_t) if split else estimate_cost(run, model, total)
    return StepReservation(run, cost, total)
