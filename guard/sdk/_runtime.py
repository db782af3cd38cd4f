"""The process-wide SDK runtime: tracer, fingerprinter, price book, exporter, control client.

Built lazily from the settings on first use, rebuilt by :func:`guard.configure`. Nothing here
raises into the agent: a failing exporter or guard degrades to local-only behaviour.
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import threading
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from guard.policy import DEFAULT_PRICE_BOOK, Fingerprinter, Limits
from guard.sdk._clock import SYSTEM_CLOCK, Clock
from guard.sdk._config import Settings, get_settings
from guard.sdk._providers import RELAY, install_global_provider, relay_for
from guard.sdk._targets import Route

if TYPE_CHECKING:  # pragma: no cover
    from guard.sdk._control import ControlClient
    from guard.sdk._export import LowLatencySpanProcessor
    from guard.sdk._foreign import ForeignSpans
    from guard.sdk._redact import RedactingSpanExporter

__all__ = ["Runtime", "current_runtime", "get_runtime", "reset_runtime", "stats"]

log = logging.getLogger("guard.sdk")

_DEFAULT_IGNORE = ("page", "offset", "cursor", "request_id", "timestamp")


class Runtime:
    """Everything a run needs from the process. One instance per settings object."""

    def __init__(self, settings: Settings) -> None:
        from guard import __version__

        self.settings = settings
        self.provider, self.owns_provider = self._pick_provider(settings)
        self.tracer = self.provider.get_tracer("otel-guard", __version__)
        # No key configured: one random key per runtime, shared by every ignore-field variant
        # (fingerprints then compare within this process only, enough for loop detection).
        self._hmac_key = settings.hmac_key or secrets.token_bytes(32)
        self._fingerprinters: dict[tuple[str, ...], Fingerprinter] = {}
        self.fingerprinter = self.fingerprinter_for(_DEFAULT_IGNORE)
        self.price_book: Any = settings.price_book or DEFAULT_PRICE_BOOK
        self.price_book_version: str = getattr(self.price_book, "version", "") or ""
        self.clock: Clock = settings.clock or SYSTEM_CLOCK  # deadlines and pauses of runs
        self.policy_defaults: Limits | None = None  # pushed by the guard (Welcome / Policy)
        self._lock = threading.Lock()
        self._guarded: dict[int, int] = {}  # trace_id -> live runs in it
        self.processor: LowLatencySpanProcessor | None = None
        self.redactor: RedactingSpanExporter | None = None
        self.span_exporter: Any = None  # the OTLP exporter, or the failover export over several
        self.control: ControlClient | None = None
        self.route = Route()  # the guard the control stream holds; the span export follows it
        if settings.span_target is not None:
            self._attach_exporter(settings)
        self.foreign: ForeignSpans | None = None
        self._attach_foreign()
        if settings.endpoint is not None:
            self._attach_control(settings)
        # Counted spans carry their record number (guard.seq) when runs re-register through a
        # control stream: the one thing the number is for (and the guard's sign that an agent
        # will come back for the run, so it never writes a span-derived record for it).
        self.number_spans = self.control is not None

    # -- providers and export ---------------------------------------------------------------
    @staticmethod
    def _pick_provider(settings: Settings) -> tuple[TracerProvider, bool]:
        """The application's provider when it has an SDK one; else, with a guard configured,
        a global one installed for it (so instrumentations' spans reach the guard); else
        (local-only) a private one. See ``install_global_provider``."""
        if settings.tracer_provider is not None:
            return settings.tracer_provider, False
        current = trace.get_tracer_provider()
        if isinstance(current, TracerProvider):
            desc = getattr(getattr(current, "sampler", None), "get_description", lambda: "")()
            if "root:AlwaysOnSampler" not in desc and desc != "AlwaysOnSampler":
                # Unsampled guard spans never reach the guard: it then sees only heartbeats.
                log.warning(
                    "otel-guard: the application's sampler (%s) may drop guard spans; local "
                    "limits still apply, the guard sees heartbeats and outcomes only",
                    desc,
                )
            return current, False
        if settings.endpoint is not None or settings.span_target is not None:
            installed = install_global_provider(current)
            if installed is not None:
                return installed, False
        # Local-only (or a provider we cannot attach to): a private one, whose guard spans the
        # application never sees.
        return TracerProvider(), True

    def _attach_foreign(self) -> None:
        """Count third-party spans in-process; the export to the guard goes behind that
        (stamped or dropped spans, guard.sdk._foreign). One relay per provider: a rebuilt
        runtime replaces the chain instead of stacking another one on the provider."""
        from guard.sdk._foreign import ForeignSpans

        try:
            self.foreign = ForeignSpans(self, self.processor)
            relay_for(self.provider).point_to(self.foreign)
        except Exception:
            log.exception("otel-guard: could not attach the span processor; spans stay local")

    def _attach_exporter(self, settings: Settings) -> None:
        """The SDK's own low-latency span export (``span_export="direct"``)."""
        from guard.sdk._export import (
            LowLatencySpanProcessor,
            channel_credentials,
            make_otlp_exporter,
        )
        from guard.sdk._redact import RedactingSpanExporter

        assert settings.span_target is not None
        try:
            exporter = self._span_exporter(settings, make_otlp_exporter, channel_credentials)
            # No content leaves the process on the way to the guard, whoever put it on a
            # span; the application's own processors on this provider see the spans as is.
            self.span_exporter = exporter
            self.redactor = RedactingSpanExporter(exporter)
            self.processor = LowLatencySpanProcessor(
                self.redactor,
                max_delay_ms=settings.export_max_delay_ms,
                max_batch=settings.export_max_batch,
                queue_size=settings.export_queue_size,
                trace_filter=self.is_guarded,
            )
        except Exception:
            log.exception("otel-guard: could not attach the span exporter; spans stay local")

    def _span_exporter(self, settings: Settings, make: Any, credentials: Any) -> Any:
        """One OTLP exporter for one ``span_endpoint``; else a failover export that follows
        the control stream from guard to guard (no ``span_endpoint``) or rotates over the
        ``span_endpoint`` entries."""
        from guard.sdk._failover_export import FailoverSpanExporter
        from guard.sdk._targets import Address

        creds = credentials(settings) if settings.span_secure else None
        follow = settings.spans_follow_control
        # several places: an unreachable one fails the batch at once and the next one gets it
        retry_unavailable = not follow and len(settings.span_targets) == 1

        def build(addr: Address) -> Any:
            return make(
                addr.target,
                token=settings.token,
                credentials=creds,
                timeout_s=settings.export_timeout_s,
                channel_options=addr.channel_options(),
                retry_unavailable=retry_unavailable,
            )

        addrs = [Address(t, t, t) for t in settings.span_targets]
        if follow:
            return FailoverSpanExporter(
                build, route=self.route, targets=addrs[:1], wait_s=settings.export_timeout_s
            )
        if len(addrs) == 1:
            return build(addrs[0])
        return FailoverSpanExporter(build, targets=addrs, wait_s=settings.export_timeout_s)

    def _attach_control(self, settings: Settings) -> None:
        from guard.sdk._control import ControlClient

        try:
            self.control = ControlClient(settings, self)
            self.control.start()
        except Exception:
            log.exception("otel-guard: could not start the control stream; local-only")
            self.control = None

    def is_guarded(self, trace_id: int) -> bool:
        return trace_id in self._guarded

    def trace_started(self, trace_id: int) -> None:
        with self._lock:
            self._guarded[trace_id] = self._guarded.get(trace_id, 0) + 1

    def trace_ended(self, trace_id: int) -> None:
        with self._lock:
            n = self._guarded.get(trace_id, 0) - 1
            if n <= 0:
                self._guarded.pop(trace_id, None)
            else:
                self._guarded[trace_id] = n

    # -- policy ---------------------------------------------------------------------------
    def fingerprinter_for(self, ignore_fields: tuple[str, ...]) -> Fingerprinter:
        fp = self._fingerprinters.get(ignore_fields)
        if fp is None:
            fp = Fingerprinter(self._hmac_key, ignore_fields=ignore_fields)
            self._fingerprinters[ignore_fields] = fp
        return fp

    def set_policy(self, defaults: Limits | None, price_book: Any | None) -> None:
        """Apply a policy pushed by the guard (run defaults and prices) to future runs."""
        if defaults is not None:
            self.policy_defaults = defaults
        if price_book is not None and price_book.models and self.settings.price_book is None:
            self.price_book = price_book
            self.price_book_version = price_book.version or ""

    def cost_usd(
        self, model: str, input_tokens: int, output_tokens: int, cached_tokens: int
    ) -> float | None:
        """The price book's cost of one call; ``None`` when unpriced (or the book failed)."""
        try:
            return self.price_book.cost_usd(
                model,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                cached_tokens=cached_tokens,
            )
        except Exception:
            log.debug("price book lookup failed for %r", model, exc_info=True)
            return None

    # -- lifecycle --------------------------------------------------------------------------
    def flush(self, timeout_s: float = 5.0) -> bool:
        ok = True
        if self.processor is not None:
            ok = self.processor.force_flush(timeout_s * 1000)
        return ok

    def close(self) -> None:
        """Shut down in dependency order: the spans still queued go out first (the guard
        sees a run's last steps), then the control stream drains its last RunEnded records
        and half-closes, then the exporter and, if it is ours, the provider, each once."""
        flushed = True
        if self.processor is not None:
            try:
                flushed = self.processor.force_flush(2000)
            except Exception:  # pragma: no cover
                log.debug("span flush failed", exc_info=True)
        if self.control is not None:
            try:
                self.control.stop()
            except Exception:  # pragma: no cover
                log.debug("control stop failed", exc_info=True)
        relay = getattr(self.provider, RELAY, None)
        if relay is not None:
            relay.release(self.foreign)
        if self.processor is not None:
            try:
                # A guard that did not take the spans within 2 s gets no second 2 s wait.
                self.processor.shutdown(flush_timeout_ms=2000 if flushed else 0)
            except Exception:  # pragma: no cover
                log.debug("processor shutdown failed", exc_info=True)
        if self.owns_provider:
            try:
                self.provider.shutdown()
            except Exception:  # pragma: no cover
                log.debug("provider shutdown failed", exc_info=True)


_lock = threading.Lock()
_runtime: Runtime | None = None


def current_runtime() -> Runtime | None:
    """The runtime if one was built (none is built here)."""
    return _runtime


def get_runtime() -> Runtime:
    """The current runtime, built from the settings on first use."""
    rt = _runtime
    if rt is not None:
        return rt
    return _build()


def _build() -> Runtime:
    global _runtime
    with _lock:
        if _runtime is None:
            _runtime = Runtime(get_settings())
        return _runtime


def reset_runtime(old: Settings | None = None) -> None:
    """Close the current runtime; the next run builds one from the new settings."""
    global _runtime
    with _lock:
        rt, _runtime = _runtime, None
    if rt is not None:
        rt.close()


def stats(runtime: Runtime | None = None) -> dict[str, int]:
    """Counters of the guard connection: spans exported / failed / dropped, content removed
    from them on the way to the guard (spans, attributes, events), stream events. Of the
    current runtime, or of ``runtime`` (e.g. one already closed by ``guard.shutdown()``, whose
    ``control_records_unacknowledged`` is only known once it closed)."""
    rt = runtime or _runtime
    out: dict[str, int] = {}
    if rt is None:
        return out
    p = rt.processor
    if p is not None:
        out.update(
            spans_exported=p.exported,
            spans_failed=p.failed,
            spans_dropped=p.dropped,
            export_batches=p.batches,
        )
    if rt.redactor is not None:
        out.update(rt.redactor.counters())
    if rt.foreign is not None:
        out.update(rt.foreign.counters())
    failovers = getattr(rt.span_exporter, "failovers", None)
    if failovers is not None:
        out["spans_failovers"] = failovers
    if rt.control is not None:
        out.update({f"control_{k}": v for k, v in rt.control.counters.items()})
        out["control_connected"] = int(rt.control.connected.is_set())
    return out


def _after_fork_in_child() -> None:
    """A forked worker (gunicorn, multiprocessing) has none of the parent's threads: forget the
    runtime without closing it, so the first run in the child builds its own."""
    global _runtime
    rt, _runtime = _runtime, None
    if rt is not None and rt.processor is not None:
        rt.processor._stopped = True  # its worker thread did not survive the fork


# At interpreter exit: send the last RunEnded records and spans (bounded by the drain timeouts).
atexit.register(reset_runtime)
os.register_at_fork(after_in_child=_after_fork_in_child)
