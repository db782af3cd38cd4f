"""``guard.step()``: one decision iteration of the agent loop, usable with ``with``/``async with``."""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from guard import semconv as A
from guard.policy import Phase
from guard.sdk._calls import _ERROR, MISSING, _provider_cache, emit_call_span, record_tool_call
from guard.sdk._calls import provider_for as _provider_for
from guard.sdk._foreign_calls import claim_integrated
from guard.sdk._implicit import end_step, hold_step, hold_step_async, note_call
from guard.sdk._outcome import tag
from guard.sdk._reserve import current_reservation, make_reservation
from guard.sdk._run import _current as _current_run

if TYPE_CHECKING:  # pragma: no cover
    from guard.sdk._reserve import StepReservation
    from guard.sdk._run import LiveRun

__all__ = ["Step", "current_step", "step"]

_current_step: contextvars.ContextVar[Step | None] = contextvars.ContextVar(
    "guard_step", default=None
)
# Hot path (every step): module-level names instead of attribute lookups.
_AFTER_MODEL = Phase.AFTER_MODEL_CALL
_CLIENT = SpanKind.CLIENT
_OPERATION, _REQUEST_MODEL, _INPUT_TOKENS, _OUTPUT_TOKENS = (
    A.OPERATION,
    A.REQUEST_MODEL,
    A.INPUT_TOKENS,
    A.OUTPUT_TOKENS,
)
_CACHE_READ, _REASONING_TOKENS = A.CACHE_READ, A.REASONING_TOKENS
_STEP_SPAN, _RUN_ID, _TENANT, _STEP_INDEX = A.STEP_SPAN, A.RUN_ID, A.TENANT, A.STEP_INDEX
_PROGRESS, _STATE_HASH, _ACTION_FP, _SEQ = A.PROGRESS, A.STATE_HASH, A.ACTION_FP, A.SEQ
_current_res_get = current_reservation.get
_set_span_in_context, _attach, _detach = (
    trace.set_span_in_context,
    otel_context.attach,
    otel_context.detach,
)


_CURRENT: Any = object()  # Step(): a step of the current run


def current_step() -> Step | None:
    """The innermost open step of this context, or ``None``."""
    return _current_step.get()


def progress(made: bool | None = None, *, facts: Any = None) -> None:
    """Report the task's progress from anywhere in a run, e.g. inside a framework's tool:
    ``guard.progress(facts=[...])`` or ``guard.progress(False)``, as :meth:`Step.progress`.

    It goes to the innermost open step of the code's own, else to the step an integration
    inferred for the current model turn (``guard.instrument()``). Outside a run, or with no
    step open, nothing happens. What the agent reports wins over the progress derived from
    its tool results.
    """
    st = _current_step.get()
    if st is None or st.run is None:
        run = _current_run.get()
        st = run.inferred_step if run is not None and run.live else None
    if st is not None:
        st.progress(made, facts=facts)


class Step:
    """One step. Outside a run (or with the SDK disabled) every method is a cheap no-op.

    ``step.model_call(...)`` and ``step.tool_call(...)`` record usage and evaluate the policy
    after the call; ``step.progress(...)`` feeds the stagnation detector. Entering a step
    checks the policy first and raises ``RunStopped`` when the run must not take another step.
    ``Step()`` (``guard.step()``) is a step of the current run, ``Step(run)`` one of ``run``.
    """

    __slots__ = (
        "_ctx",
        "_implicit",
        "_otel_token",
        "_progress",
        "_spent",
        "_state",
        "_token",
        "action",
        "calls",
        "index",
        "integrated",
        "run",
        "span",
        "tool_calls",
    )

    def __init__(self, run: LiveRun | None = _CURRENT) -> None:
        self.run = _current_run.get() if run is _CURRENT else run
        self.index = 0
        self.span: Any = None
        self.action: str | None = None
        self.tool_calls = 0
        # guard.sdk._foreign.CallLedger, made when a third-party span starts in this step
        self.calls: Any = None
        # the calls an integration recorded in it, (response id, input, output, cost)
        self.integrated: list[Any] | None = None
        self._progress: bool | None = None
        self._state: str | None = None
        self._ctx: Any = None
        self._token: Any = None
        self._otel_token: Any = None
        self._implicit: Any = None  # the run's mean per step, held while it runs (_implicit)
        self._spent: tuple[float | None, int] | None = None  # (cost_usd, tokens) of its calls

    # -- context manager ------------------------------------------------------------------
    def __enter__(self) -> Step:
        run = self.run
        if run is None:
            return self
        index, seq = run.begin_step()
        self._implicit = hold_step(self)  # before the call: RunStopped if it cannot be covered
        return self._open(run, index, seq)

    def _open(self, run: LiveRun, index: int, seq: int) -> Step:
        self.index = index
        attrs: dict[str, str | int] = {_RUN_ID: run.run_id, _TENANT: run.tenant, _STEP_INDEX: index}
        if run.numbered:
            attrs[_SEQ] = seq
        span = self.span = run.rt.tracer.start_span(_STEP_SPAN, context=run.ctx, attributes=attrs)
        self._ctx = ctx = _set_span_in_context(span)
        self._otel_token = _attach(ctx)
        self._token = _current_step.set(self)
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        run = self.run
        span = self.span
        if run is None or span is None:
            return
        if self._implicit is not None or self._spent is not None or run.means.pending:
            end_step(self)  # (pending: steps that began before the run's first mean)
        # The code's progress or facts, else the progress its tool results show (the span
        # carries either, so the guard's detector sees what the run's own detector sees).
        progress, state = run.end_step(self._progress, self._state, self.tool_calls, ok=et is None)
        action = self.action
        attrs: dict[str, Any] = {}
        if progress is not None:
            attrs[_PROGRESS] = progress
        if state is not None:
            attrs[_STATE_HASH] = state
        if action is not None:
            attrs[_ACTION_FP] = action
        if et is not None:
            attrs[A.ERROR_TYPE] = et.__qualname__
            span.set_status(_ERROR)
        if attrs:
            span.set_attributes(attrs)
        span.end()
        try:
            _current_step.reset(self._token)
            _detach(self._otel_token)
        except ValueError:  # exited in another context (e.g. a generator); harmless
            pass
        self.span = None

    async def __aenter__(self) -> Step:
        run = self.run
        if run is None:
            return self
        index, seq = run.begin_step()
        self._implicit = await hold_step_async(self)  # the tenant check without blocking
        return self._open(run, index, seq)

    async def __aexit__(self, et: Any, ev: Any, tb: Any) -> None:
        self.__exit__(et, ev, tb)

    # -- reservations -------------------------------------------------------------------------
    def reserve(
        self,
        cost_usd: float | None = None,
        tokens: int | None = None,
        *,
        model: str | None = None,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
    ) -> StepReservation:
        """Hold an estimate before a call: ``with step.reserve(cost_usd=0.02, tokens=4_000):``.

        Held atomically against the run, its ancestors and its tenant's allowance when the
        block is entered (``with`` or ``async with``); ``RunStopped`` then, before the call,
        when it cannot be covered (``cost_budget`` / ``token_budget`` / ``tenant_budget``).
        A ``model_call`` inside the block settles it with the actual usage; leaving the block
        otherwise (no call, an exception, a cancel) releases it.

        The tokens are ``tokens`` (a total) or, split, ``input_tokens`` + ``output_tokens``
        (``step.reserve(input_tokens=1_200, output_tokens=400, model="gpt-4.1")``); giving
        both is ``InvalidInput``. Without ``cost_usd``, ``model=`` prices them from the price
        book: a split at the model's input and output rates, a total at its dearer rate (an
        upper bound); an unpriced model reserves tokens only.
        """
        return make_reservation(
            self.run,
            cost_usd,
            tokens,
            model,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
        )

    # -- recording --------------------------------------------------------------------------
    def _parent(self) -> Any:
        return self._ctx if self._ctx is not None else self.run.ctx  # type: ignore[union-attr]

    def model_call(
        self,
        *,
        model: str,
        input_tokens: int = 0,
        output_tokens: int = 0,
        reasoning_tokens: int = 0,
        cached_tokens: int = 0,
        cost_usd: float | None = None,
        provider: str | None = None,
        operation: str = "chat",
        response_id: str | None = None,
        error: BaseException | None = None,
        started_at: float | None = None,
    ) -> float | None:
        """Record a model call. ``input_tokens`` include cached ones, ``output_tokens`` the
        reasoning ones (GenAI conventions). Cost comes from the price book unless given;
        ``None`` when unpriced. Pass ``error=`` for a failed call (recorded as model_error
        if it escapes the run). ``started_at`` (Unix seconds) sets the span start.
        """
        run = self.run
        if run is None:
            return cost_usd
        # The run's largest reply so far: what an integration holds for the output of a
        # request that sets no max tokens (guard.integrations._estimate). A failed call or
        # one without usage (0) says nothing about the size of a reply.
        if (
            error is None
            and type(output_tokens) is int
            and output_tokens > run.max_output_tokens_seen
        ):
            run.max_output_tokens_seen = output_tokens
        if self.integrated:  # the code reports a call an integration recorded: the same call
            done = claim_integrated(self, response_id, input_tokens, output_tokens)
            if done is not None:
                run.check_interrupt()
                return done[3] if cost_usd is None else cost_usd
        calls = self.calls
        if calls is not None:  # an instrumentation's span of this step may report it too
            claimed = calls.claim(response_id, input_tokens, output_tokens)
            if claimed is not None:
                # Counted from that span already (it is the call's span to the guard as well).
                run.check_interrupt()
                return claimed[3] if cost_usd is None else cost_usd
        # The whole recording inline (one model call per step on the hot path).
        parent_ctx = self._ctx if self._ctx is not None else run.ctx
        rt = run.rt
        if cost_usd is None:
            cost_usd = rt.cost_usd(model, input_tokens, output_tokens, cached_tokens)
        note_call(self, cost_usd, input_tokens + output_tokens)  # the run's mean per step
        # Recorded and decided under one lock; the decision is applied once the span is out.
        # A reservation of this context (step.reserve) is settled by the call, in that lock.
        sres = _current_res_get() or self._implicit  # (an implicit one may be held late)
        seq, d = run.budget.model_call_escalation(
            input_tokens,
            output_tokens,
            reasoning_tokens,
            cached_tokens,
            cost_usd,
            run.soft.rank,  # run.soft_rank, without the property call
            sres.take() if sres is not None and sres.run is run else None,
        )
        attrs: dict[str, Any] = {
            _OPERATION: operation,
            _REQUEST_MODEL: model,
            _INPUT_TOKENS: input_tokens,
            _OUTPUT_TOKENS: output_tokens,
            _CACHE_READ: cached_tokens,
            _REASONING_TOKENS: reasoning_tokens,
            _RUN_ID: run.run_id,
        }
        if run.numbered:
            attrs[_SEQ] = seq
        if provider is None:
            provider = _provider_cache.get(model, MISSING)
            if provider is MISSING:
                provider = _provider_for(model)
        if provider:
            attrs[A.PROVIDER] = provider
        if cost_usd is not None:
            attrs[A.COST_USD] = cost_usd
        if response_id:
            attrs[A.RESPONSE_ID] = response_id
        if calls is not None:  # the instrumentation's span may end after this record
            calls.recorded.append((response_id, input_tokens, output_tokens, cost_usd))
        if error is None:
            run.did_work = True
        else:
            attrs[A.ERROR_TYPE] = type(error).__qualname__
            tag(error, "model")
        if started_at is None and error is None:  # emit_call_span's usual case, inline
            rt.tracer.start_span(
                f"{operation} {model}", context=parent_ctx, kind=_CLIENT, attributes=attrs
            ).end()
        else:
            emit_call_span(
                rt.tracer, f"{operation} {model}", parent_ctx, _CLIENT, attrs, started_at, error
            )
        # Recorded first: completed results are kept. No reservation: keep room for the next call.
        if d is None and run.parent is None and (sres is not None or run.root.allowance is None):
            if run.interrupted:  # all that after_call would do (see there)
                run.check_stop()
        else:
            spent = (cost_usd, input_tokens + output_tokens) if sres is None else None
            run.after_call(_AFTER_MODEL, d, spent=spent, raise_interrupt=True)
        return cost_usd

    def tool_call(
        self,
        name: str,
        args: Any = None,
        *,
        result: Any = MISSING,
        attempts: int = 1,
        cost_usd: float | None = None,
        error: BaseException | None = None,
        call_id: str | None = None,
        started_at: float | None = None,
        poll: bool = False,
    ) -> str | None:
        """Record a finished tool call; returns its action fingerprint (HMAC of name+args).

        The call is recorded first (completed results are kept), then a cancel or a stop
        reached by it is raised. ``poll=True``: the call is a poll (a job status checked until
        it changes), judged by the poll rule instead of the repeat and cycle patterns.
        """
        run = self.run
        if run is None:
            return None
        self.tool_calls += 1
        fp = record_tool_call(
            run,
            self._ctx if self._ctx is not None else run.ctx,
            self,
            name,
            args,
            result,
            attempts,
            cost_usd,
            error,
            call_id,
            started_at,
            poll=poll,
        )
        if run.interrupted:  # run.check_interrupt(), without the call
            run.check_stop()
        return fp

    def note_tool(self, action: str) -> None:
        self.action = action

    def progress(self, made: bool | None = None, *, facts: Any = None) -> None:
        """Report progress: ``progress(True)``, or ``facts=[...]`` whose hash is the state.

        The state hash changes when the facts change; an unchanged state over
        ``no_progress_steps`` steps is stagnation. A step that reports neither gets its
        progress from its tool results: ``True`` when one is new to the run, ``False`` when
        all were seen before, none without results.
        """
        if self.run is None:
            return
        if made is not None:
            self._progress = bool(made)
        if facts is not None:
            self._state = self.run.fp.state(facts)


# ``guard.step()``: open one step of the current run (``with guard.step() as step: ...``). The
# class itself, whose ``Step()`` takes the current run: a step costs no extra function call.
step = Step
