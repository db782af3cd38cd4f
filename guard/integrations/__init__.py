"""``guard.instrument()``: turn on the integrations of the libraries the agent uses.

Each integration is a module here exposing ``NAME``, ``LIBRARY`` (the import name of the
library it adapts), ``enable()`` and ``disable()``. A module is imported only when it is turned
on, and it imports its library only then, so ``import guard`` imports no integration library.
The shared contract (runs, inferred steps, guarded model calls, tool admission) is
:mod:`guard.integrations._base`.

``openai`` comes first: the frameworks call the ``openai`` client underneath, so their model
calls are counted, reserved and cancel-checked there, once; a framework integration adds run
boundaries, tools, steps and the framework's own way to stop.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from guard.errors import ConfigError
from guard.sdk._polls import clear_polls, declare_polls

if TYPE_CHECKING:  # pragma: no cover
    from types import ModuleType

__all__ = ["KNOWN", "enabled", "instrument", "uninstrument"]

log = logging.getLogger("guard.integrations")

# name -> (library import name, integration module, extra). Order = the order they turn on.
KNOWN: dict[str, tuple[str, str, str]] = {
    "openai": ("openai", "guard.integrations.openai", "openai"),
    "anthropic": ("anthropic", "guard.integrations.anthropic", "anthropic"),
    "openai_agents": ("agents", "guard.integrations.openai_agents", "openai-agents"),
    "pydantic_ai": ("pydantic_ai", "guard.integrations.pydantic_ai", "pydantic-ai"),
    "langchain": ("langchain_core", "guard.integrations.langgraph", "langgraph"),
}
# other spellings users reach for (the LangChain/LangGraph integration is named "langchain")
ALIASES = {"langgraph": "langchain"}


def _resolve(names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(ALIASES.get(n, n) for n in names)


_on: dict[str, object] = {}  # name -> its module, while turned on
_lock = threading.Lock()


def _available(name: str) -> bool:
    library, module, _ = KNOWN[name]
    return (
        importlib.util.find_spec(library) is not None
        and importlib.util.find_spec(module) is not None
    )


def instrument(*names: str, polls: Iterable[str] = ()) -> list[str]:
    """Turn on the named integrations, or every one whose library can be imported.

    Idempotent: an integration already on stays on (once). Returns the names that are on among
    those asked for (all of them: every importable one), in turn-on order. An unknown name, or a
    named one whose library is not installed, is a :class:`~guard.errors.ConfigError`. A library
    release that no longer has what its integration wraps leaves that integration off, with
    nothing of it patched: a ``ConfigError`` when it was named, else a warning.

    ``polls``: names of tools that are polls (a job status checked until it changes), for every
    run of this process: their repeated identical calls are not a loop, but the same call
    answering the same result ``loop.max_unchanged_polls`` times in a row is. Added to the
    names declared before; ``uninstrument()`` (of everything) forgets them.
    """
    names = _resolve(names)
    declare_polls(polls, path="instrument.polls")  # checked before anything turns on
    unknown = [n for n in names if n not in KNOWN]
    if unknown:
        raise ConfigError(
            f"unknown integration {unknown[0]!r}; known: {', '.join(KNOWN)}", path="instrument"
        )
    wanted = [n for n in KNOWN if n in names] if names else list(KNOWN)
    out: list[str] = []
    with _lock:
        for name in wanted:
            if name in _on:
                out.append(name)
                continue
            if not _available(name):
                if names:
                    library, _, extra = KNOWN[name]
                    raise ConfigError(
                        f"integration {name!r} needs {library!r}: "
                        f"pip install 'otel-guard[{extra}]'",
                        path="instrument",
                    )
                continue
            mod = importlib.import_module(KNOWN[name][1])
            try:
                mod.enable()
            except Exception as exc:  # a release that moved what the integration wraps
                _undo(mod)
                library, _, extra = KNOWN[name]
                msg = (
                    f"integration {name!r} cannot guard {library} {_version(library)}: "
                    f"{type(exc).__name__}: {exc}; the tested releases are pinned by "
                    f"pip install 'otel-guard[{extra}]'"
                )
                if names:
                    raise ConfigError(msg, path="instrument") from exc
                log.warning("otel-guard: %s (left off; the other integrations are on)", msg)
                continue
            _on[name] = mod
            out.append(name)
    return out


def _undo(mod: ModuleType) -> None:
    try:
        mod.disable()  # what enable() patched before it failed
    except Exception:
        log.exception("otel-guard: undoing a failed integration")


def _version(library: str) -> str:
    from importlib.metadata import PackageNotFoundError, packages_distributions, version

    try:
        dist = (packages_distributions().get(library) or [library])[0]
        return version(dist)
    except (PackageNotFoundError, IndexError):
        return "(version unknown)"


def uninstrument(*names: str) -> list[str]:
    """Turn integrations off again (all, or the named ones); returns the names turned off.
    Turning everything off also forgets the tools declared as polls (``instrument(polls=)``)."""
    names = _resolve(names)
    with _lock:
        off = [n for n in reversed(list(_on)) if not names or n in names]
        for name in off:
            _on.pop(name).disable()  # type: ignore[attr-defined]
        if not names:
            clear_polls()
    return off


def enabled() -> list[str]:
    """The integrations that are on."""
    with _lock:
        return list(_on)
