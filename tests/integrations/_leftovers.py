"""Wrappers that third-party instrumentations leave on the client classes after uninstrument().

OpenLLMetry 0.62's OpenAI instrumentation, for one, stops unwrapping at the first module that
openai 3 no longer has, so its wrappers of ``Completions.create`` stay. Left in a test worker,
every later test's instrumentation wraps them again: after 25 tests a streamed response is a
proxy 25 levels deep, and one failed attribute lookup on it walks the levels exponentially
(a 0.1 s test took 160 s). The suite removes them after each test and fails the test that
left them, so the next test starts with the classes as the libraries define them.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["leftovers", "unwrap_leftovers"]

_FOREIGN = ("opentelemetry.instrumentation.", "openinference.")
# where these instrumentations wrap: the clients' resources and request methods, and
# LangChain's callback manager (OpenInference)
_SCANNED = (
    "openai.resources.",
    "openai._base_client",
    "anthropic.resources.",
    "anthropic._base_client",
    "langchain_core.callbacks.",
)


try:
    # what these instrumentations wrap with (wrap_function_wrapper); in wrapt 2 it is not a
    # subclass of wrapt.ObjectProxy
    from wrapt import FunctionWrapper as _Proxy
except ImportError:  # no wrapt: nothing of theirs can be left
    _Proxy = ()  # type: ignore[assignment,misc]


def _foreign(attr: Any) -> bool:
    # the type check first: reading attributes of any other class member may run code (the
    # clients' lazy proxies build a client on first touch)
    if not issubclass(type(attr), _Proxy):  # type(), not isinstance(): no __class__ read
        return False
    wrapper = getattr(attr, "_self_wrapper", None)  # a wrapt FunctionWrapper's wrapper
    return (getattr(wrapper, "__module__", None) or "").startswith(_FOREIGN)


_classes: dict[str, list[type]] = {}  # module name -> the classes it defines (scanned once)


def _wrapped_attrs() -> list[tuple[type, str]]:
    found = []
    # a copy in one step: iterating the live dict (list(items())) may meet another
    # thread's import when making a tuple sets off a collection that runs Python code
    for name, module in sys.modules.copy().items():
        if not name.startswith(_SCANNED) or module is None:
            continue
        classes = _classes.get(name)
        if classes is None:
            classes = _classes[name] = [
                obj
                for obj in list(vars(module).values())
                # type(), not isinstance(): no __class__ read (openai's lazy proxies import on it)
                if issubclass(type(obj), type) and obj.__module__ == name
            ]
        for cls in classes:
            found += [(cls, a) for a, v in list(vars(cls).items()) if _foreign(v)]
    return found


def leftovers() -> list[str]:
    """``module.Class.attr`` of each client method a foreign instrumentation still wraps."""
    return sorted(f"{cls.__module__}.{cls.__qualname__}.{attr}" for cls, attr in _wrapped_attrs())


def unwrap_leftovers() -> int:
    """Strip the foreign wrappers (every layer of them); returns how many methods had some."""
    attrs = _wrapped_attrs()
    for cls, attr in attrs:
        value = vars(cls)[attr]
        while _foreign(value):
            value = value.__wrapped__
        setattr(cls, attr, value)
    return len(attrs)
