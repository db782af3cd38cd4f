"""The TracerProvider otel-guard's span processors sit on, its own or the application's.

``install_global_provider``: with a guard configured and no SDK provider set globally, one is
installed, so third-party instrumentations' spans reach the guard. ``relay_for``: the single
processor otel-guard adds to a provider, pointed at the current runtime's chain.
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

__all__ = ["RELAY", "install_global_provider", "relay_for"]

log = logging.getLogger("guard.sdk")

RELAY = "_otel_guard_relay"
_warned_provider = False


class _Relay(SpanProcessor):
    """The one processor otel-guard adds to a TracerProvider: it hands every span to the
    current runtime's chain (``point_to``), so configure() / shutdown() never stack processors
    on an application's provider. Unpointed, it does nothing."""

    # Called by the provider as every span ends, with nothing for the relay to do there: a
    # builtin that takes the span and ignores it (a C call, not a Python frame per span).
    _on_ending = id  # type: ignore[assignment]  # a builtin taking the span, not a method

    def __init__(self) -> None:
        self._target: Any = None

    def point_to(self, target: Any) -> None:
        self._target = target
        # the provider calls these directly: no extra hop per span
        self.on_start = target.on_start  # type: ignore[method-assign]
        self.on_end = target.on_end  # type: ignore[method-assign]
        bind = getattr(target, "bind_relay", None)
        if bind is not None:  # the target may route ended spans past itself for a while
            bind(self)

    def route_ends(self, target: Any, on_end: Any) -> None:
        """``target`` (the current one, else nothing happens) takes ended spans with
        ``on_end`` from now on."""
        if self._target is target:
            self.on_end = on_end  # type: ignore[method-assign]

    def release(self, target: Any) -> None:
        if self._target is target:
            self._target = None
            self.on_start = _Relay.on_start.__get__(self)  # type: ignore[method-assign]
            self.on_end = _Relay.on_end.__get__(self)  # type: ignore[method-assign]

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        return None

    def on_end(self, span: Any) -> None:
        return None

    def shutdown(self) -> None:
        t = self._target
        if t is not None:
            t.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        t = self._target
        return True if t is None else t.force_flush(timeout_millis)


def relay_for(provider: TracerProvider) -> _Relay:
    """The provider's relay, added to it on first use."""
    relay = getattr(provider, RELAY, None)
    if relay is None:
        relay = _Relay()
        provider.add_span_processor(relay)
        setattr(provider, RELAY, relay)
    return relay


def install_global_provider(current: Any) -> TracerProvider | None:
    """With a guard configured and no SDK TracerProvider set globally, install one, so that
    instrumentations writing to the global provider (OpenLLMetry, OpenInference, ...) reach
    the guard, whether they were set up before or after ``guard.configure``: their proxy
    tracers follow the global once it is set. It happens when the first run starts, so an
    application that sets its own provider before that keeps it (and gets ours attached);
    one set later is refused by OpenTelemetry (set-once) and should instead add its
    processors to ``trace.get_tracer_provider()``. A global provider of another kind (not the
    OpenTelemetry SDK's) cannot carry our processor: one warning says what to do."""
    global _warned_provider
    if isinstance(current, trace.ProxyTracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
        if trace.get_tracer_provider() is provider:
            log.info(
                "otel-guard: no TracerProvider was set; installed an SDK TracerProvider "
                "globally so that instrumentations' spans reach the guard"
            )
            return provider
        current = trace.get_tracer_provider()
        if isinstance(current, TracerProvider):  # set by another thread meanwhile
            return current
    if not _warned_provider:
        _warned_provider = True
        log.warning(
            "otel-guard: the global TracerProvider is a %s, not an OpenTelemetry SDK "
            "TracerProvider: spans of other instrumentations (OpenLLMetry, OpenInference, "
            "OpenLIT) are not counted by otel-guard. Set an "
            "opentelemetry.sdk.trace.TracerProvider globally before the first guarded run, "
            "or pass guard.configure(tracer_provider=...) the provider they write to",
            type(current).__name__,
        )
    return None
