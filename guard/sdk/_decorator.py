"""``@guard.run``: the decoration and its validated spec; the run itself is a
:class:`guard.sdk._scope.RunScope` around the call (span, admission, outcome, stop)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from guard.errors import ConfigError
from guard.policy import PRESETS, Limits, LoopSettings, parse_limits
from guard.sdk._config import get_settings
from guard.sdk._scope import RunScope

__all__ = ["RunSpec", "agent_spec", "run"]

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
        name: str = (
            agent if agent else getattr(f, "__qualname__", "") or getattr(f, "__name__", "agent")
        )
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


@functools.lru_cache(maxsize=256)
def agent_spec(agent: str) -> RunSpec:
    """The spec of a framework's run: the agent's name, the policy's limits (none of its own)."""
    return _make_spec(agent, None, None, {}, None, None, (), None)


def _run_sync(spec: RunSpec, f: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    with RunScope(spec):
        return f(*args, **kwargs)


async def _run_async(spec: RunSpec, f: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    async with RunScope(spec):
        return await f(*args, **kwargs)
