"""``@guard.run``: the run span, admission, local enforcement and the outcome of every run."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Status as SpanStatus
from opentelemetry.trace import StatusCode

from guard.errors import ConfigError, GuardUnavailable, RunStopped
from guard.policy import PRESETS, DecidedBy, Limits, LoopSettings, Reason, Status, parse_limits
from guard.sdk import _spans as A
from guard.sdk._config import get_settings
from guard.sdk._outcome import final_outcome, outcome_attrs
from guard.sdk._run import Run, _current, current_run_or_none
from guard.sdk._runtime import get_runtime

__all__ = ["RunSpec", "run"]

log = logging.getLogger("guard.sdk")
F = TypeVar("F", bound=Callable[..., Any])

_LIMIT_ARGS = (
    "max_steps",
    "max_tool_calls",
    "max_model_calls",
    "max_tokens",
    "max_cost_usd",
    "deadline_s",
    "reserve_tokens",
    "reserve_s",
    "soft_thresholds",
    "pause_freezes_deadline",
    "timeout_margin_s",
)


@dataclasses.dataclass(frozen=True, slots=True)
class RunSpec:
    """What a ``@guard.run`` decoration asked for (validated at decoration time)."""

    agent: str
    tenant: str | None
    requested: Limits
    explicit: frozenset[str]
    preset: str | None
    require_evidence: tuple[str, ...]
    fail_closed: bool | None

    def effective(self, defaults: Limits | None) -> Limits:
        """Guard/policy defaults, tightened by the preset, tightened by the decorator."""
        limits = self.requested
        if self.preset is not None:
            limits = PRESETS[self.preset].tighten(limits)
            if "pause_freezes_deadline" in self.explicit:  # tighten() would AND it away
                limits = dataclasses.replace(
                    limits, pause_freezes_deadline=self.requested.pause_freezes_deadline
                )
        if defaults is not None:
            limits = defaults.tighten(limits)
        return limits


def _make_spec(
    agent: str,
    tenant: str | None,
    preset: str | None,
    limit_kw: dict[str, Any],
    loop: Any,
    limits: Limits | None,
    require_evidence: Any,
    fail_closed: bool | None,
) -> RunSpec:
    given = {k: v for k, v in limit_kw.items() if v is not None}
    if isinstance(given.get("soft_thresholds"), tuple):
        given["soft_thresholds"] = list(given["soft_thresholds"])
    if isinstance(loop, LoopSettings):
        loop = {f.name: getattr(loop, f.name) for f in dataclasses.fields(loop)}
    if loop is not None:
        given["loop"] = loop
    requested = parse_limits(given, "guard.run")
    if isinstance(loop, dict) and "ignore_fields" in loop:
        requested = dataclasses.replace(
            requested,
            loop=dataclasses.replace(requested.loop, ignore_fields=tuple(loop["ignore_fields"])),
        )
    if limits is not None:
        requested = limits.tighten(requested) if given else limits
    if preset is not None and preset not in PRESETS:
        raise ConfigError(
            f"unknown preset {preset!r}; known: {', '.join(sorted(PRESETS))}", path="preset"
        )
    if isinstance(require_evidence, str):
        require_evidence = (require_evidence,)
    return RunSpec(
        agent=agent,
        tenant=tenant,
        requested=requested,
        explicit=frozenset(given),
        preset=preset,
        require_evidence=tuple(require_evidence or ()),
        fail_closed=fail_closed,
    )


def run(
    fn: Any = None,
    *,
    agent: str | None = None,
    tenant: str | None = None,
    max_steps: int | None = None,
    max_tool_calls: int | None = None,
    max_model_calls: int | None = None,
    max_tokens: int | None = None,
    max_cost_usd: float | None = None,
    deadline_s: float | None = None,
    reserve_tokens: int | None = None,
    reserve_s: float | None = None,
    soft_thresholds: tuple[float, ...] | list[float] | None = None,
    pause_freezes_deadline: bool | None = None,
    timeout_margin_s: float | None = None,
    loop: LoopSettings | dict[str, Any] | None = None,
    limits: Limits | None = None,
    preset: str | None = None,
    require_evidence: tuple[str, ...] | list[str] | str = (),
    fail_closed: bool | None = None,
) -> Any:
    """Guard an agent function (sync or async): ``@guard.run(agent="refund-bot", max_steps=12)``.

    The function's value is returned unchanged (status ``completed``/``final_answer``). A stop
    raises :class:`guard.RunStopped` with the full :class:`~guard.Outcome`. Limits given here
    only tighten the guard's policy; ``preset`` starts from a built-in preset. A nested run is
    a sub-agent: its usage also counts against the parent's budget. Bad arguments raise
    :class:`guard.errors.ConfigError` at decoration time.
    """
    limit_kw = {k: v for k, v in locals().items() if k in _LIMIT_ARGS}

    def decorate(f: F) -> F:
        name = agent or getattr(f, "__qualname__", None) or getattr(f, "__name__", "agent")
        spec = _make_spec(
            name, tenant, preset, limit_kw, loop, limits, require_evidence, fail_closed
        )
        if inspect.iscoroutinefunction(f):

            @functools.wraps(f)
            async def awrapper(*args: Any, **kwargs: Any) -> Any:
                if get_settings().disabled:
                    return await f(*args, **kwargs)
                return await _run_async(spec, f, args, kwargs)

            awrapper.__guard_spec__ = spec  # type: ignore[attr-defined]
            return awrapper  # type: ignore[return-value]

        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if get_settings().disabled:
                return f(*args, **kwargs)
            return _run_sync(spec, f, args, kwargs)

        wrapper.__guard_spec__ = spec  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate(fn) if fn is not None else decorate


# ------------------------------------------------------------------------------ lifecycle


def _start(spec: RunSpec, is_async: bool) -> tuple[Run, Any, Any]:
    rt = get_runtime()
    parent = current_run_or_none()
    tenant = spec.tenant or (parent.tenant if parent is not None else rt.settings.tenant)
    r = Run(
        rt,
        agent=spec.agent,
        tenant=tenant,
        limits=spec.effective(rt.policy_defaults),
        parent=parent,
        require_evidence=spec.require_evidence,
        is_async=is_async,
    )
    attrs: dict[str, Any] = {
        A.OPERATION: "invoke_agent",
        A.AGENT_NAME: spec.agent,
        A.RUN_ID: r.run_id,
        A.TENANT: tenant,
    }
    if r.parent_run_id:
        attrs[A.PARENT_RUN_ID] = r.parent_run_id
    r.fail_closed = _fail_closed(r, spec)
    r.span = rt.tracer.start_span(f"invoke_agent {spec.agent}", attributes=attrs)
    r.ctx = trace.set_span_in_context(r.span)
    sc = r.span.get_span_context()
    if sc.is_valid:
        r.trace_id = format(sc.trace_id, "032x")
        rt.trace_started(sc.trace_id)
    token = _current.set(r)
    otel_token = otel_context.attach(r.ctx)
    r._arm_deadline()
    return r, token, otel_token


def _admission(r: Run, spec: RunSpec) -> concurrent.futures.Future[Any] | None:
    control = r.rt.control
    if control is None:
        return None
    try:
        return control.register(r, wait=_fail_closed(r, spec))
    except Exception:  # the guard connection never breaks the agent
        log.exception("otel-guard: registering the run with the guard failed")
        return None


def _fail_closed(r: Run, spec: RunSpec) -> bool:
    return spec.fail_closed if spec.fail_closed is not None else r.rt.settings.fail_closed


def _admitted(r: Run, spec: RunSpec, fut: Any, ok: bool) -> None:
    """After the admission wait: a deny raises now; an unanswered fail_closed run refuses."""
    r.check_stop()  # a deny is an interrupt: RunStopped before the first step
    if not ok and _fail_closed(r, spec):
        ms = r.rt.settings.admit_timeout_ms
        msg = f"guard did not admit run {r.run_id} within {ms:g} ms (fail_closed)"
        out = r.snapshot(Status.FAILED, Reason.ERROR, msg, DecidedBy.SDK)
        exc = GuardUnavailable(msg)
        exc.outcome = out  # type: ignore[attr-defined]
        raise exc


def _finish(r: Run, token: Any, otel_token: Any, exc: BaseException | None) -> tuple[Any, bool]:
    try:
        outcome, stopped = final_outcome(r, exc)
        if isinstance(exc, GuardUnavailable) and getattr(exc, "outcome", None) is not None:
            outcome, stopped = exc.outcome, False
    except Exception:  # pragma: no cover - never let bookkeeping break the agent
        log.exception("otel-guard: building the outcome failed")
        outcome, stopped = (
            r.snapshot(Status.FAILED, Reason.ERROR, "sdk error", DecidedBy.SDK),
            False,
        )
    r.outcome = outcome
    leftovers = r.end()
    if outcome.status is not Status.COMPLETED:
        for p in leftovers:  # a stopped run leaves no process behind
            p.terminate(r.rt.settings.kill_grace_s)
    try:
        span = r.span
        span.set_attributes(outcome_attrs(outcome))
        if outcome.status is Status.FAILED:
            span.set_status(SpanStatus(StatusCode.ERROR))
        span.end()
    except Exception:  # pragma: no cover
        log.exception("otel-guard: ending the run span failed")
    try:
        _current.reset(token)
        otel_context.detach(otel_token)
    except ValueError:  # pragma: no cover - unwound in another context
        pass
    sc = r.span.get_span_context()
    if sc.is_valid:
        r.rt.trace_ended(sc.trace_id)
    control = r.rt.control
    if control is not None:
        try:
            control.run_ended(r, outcome)
        except Exception:
            log.exception("otel-guard: reporting the run's end to the guard failed")
    return outcome, stopped


def _admit_blocking(r: Run, spec: RunSpec) -> None:
    """Wait (bounded by ``admit_timeout_ms``) for the guard's answer to a sync run's start."""
    fut = _admission(r, spec)
    if fut is None:
        return
    timeout_s = r.rt.settings.admit_timeout_ms / 1000.0
    if asyncio._get_running_loop() is not None and not _fail_closed(r, spec):
        # A sync agent called on an event loop's thread: never stall the loop for the
        # admission; a deny that arrives later stops the run like a cancel.
        timeout_s = 0.0
    try:  # None = the stream dropped before an answer
        ok = fut.result(timeout=timeout_s) is not None
    except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
        ok = False
    _admitted(r, spec, fut, ok)


async def _admit_awaiting(r: Run, spec: RunSpec) -> None:
    """Await (bounded by ``admit_timeout_ms``) the guard's answer to an async run's start."""
    fut = _admission(r, spec)
    if fut is None:
        return
    try:  # None = the stream dropped before an answer
        answer = await asyncio.wait_for(
            asyncio.wrap_future(fut), r.rt.settings.admit_timeout_ms / 1000.0
        )
        ok = answer is not None
    except (TimeoutError, asyncio.CancelledError) as exc:
        if isinstance(exc, asyncio.CancelledError) and r.interrupt_info() is None:
            raise  # cancelled from outside while waiting
        ok = False
    _admitted(r, spec, fut, ok)


def _raise_for(outcome: Any, exc: BaseException) -> None:
    cause = None if isinstance(exc, RunStopped) else exc
    raise RunStopped(outcome) from cause


def _run_sync(spec: RunSpec, f: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    r, token, otel_token = _start(spec, False)
    try:
        _admit_blocking(r, spec)
        value = f(*args, **kwargs)
    except BaseException as exc:
        outcome, stopped = _finish(r, token, otel_token, exc)
        if stopped:
            _raise_for(outcome, exc)
        raise
    outcome, stopped = _finish(r, token, otel_token, None)
    if stopped and r.stopped is None:
        raise RunStopped(outcome)
    return value


async def _run_async(spec: RunSpec, f: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    r, token, otel_token = _start(spec, True)
    r.task = asyncio.current_task()
    r.loop = asyncio.get_running_loop()
    if r.cancelled:  # cancelled during start (e.g. by a parent): deliver to the task now
        r._cancel_task()
    try:
        await _admit_awaiting(r, spec)
        value = await f(*args, **kwargs)
    except BaseException as exc:
        r.consume_task_cancel()
        outcome, stopped = _finish(r, token, otel_token, exc)
        task = r.task
        outer_cancel = (
            isinstance(exc, asyncio.CancelledError) and task is not None and task.cancelling() > 0
        )
        if stopped and not outer_cancel:
            _raise_for(outcome, exc)
        raise
    r.consume_task_cancel()
    outcome, stopped = _finish(r, token, otel_token, None)
    if stopped and r.stopped is None:
        raise RunStopped(outcome)
    return value
