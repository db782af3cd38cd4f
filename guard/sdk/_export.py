"""Low-latency span export to the guard.

The default BatchSpanProcessor waits up to 5 s before exporting; an offending step must reach
the guard in milliseconds. :class:`LowLatencySpanProcessor` hands each ended span to one
background thread, which exports whatever is queued as one batch as soon as it wakes (after
at most ``max_delay_ms`` of coalescing). Only spans of guarded traces are forwarded, so an
application's unrelated spans do not flood the guard. Export errors are logged and counted,
never raised into the agent.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import grpc
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

if TYPE_CHECKING:  # pragma: no cover
    from guard.sdk._config import Settings

__all__ = ["LowLatencySpanProcessor", "channel_credentials", "make_otlp_exporter"]

log = logging.getLogger("guard.sdk.export")


class LowLatencySpanProcessor(SpanProcessor):
    """Exports ended spans from a background thread within a few ms of their end.

    ``trace_filter``: when given, a callable ``trace_id -> bool``; spans of other traces are
    skipped (the guard only needs guarded runs). Counters: ``exported``, ``failed``,
    ``dropped`` (queue full), ``batches``.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_delay_ms: float = 1.0,
        max_batch: int = 512,
        queue_size: int = 4096,
        trace_filter: Any = None,
    ) -> None:
        self._exporter = exporter
        self._delay_s = max(0.0, max_delay_ms) / 1000.0
        self._max_batch = max_batch
        self._queue_size = queue_size
        self._filter = trace_filter
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._cond = threading.Condition(threading.Lock())
        self._busy = False
        self._idle = False  # the worker waits for spans (set before it checks the queue)
        self._stopped = False
        self._shut = False
        self._shutdown_lock = threading.Lock()
        self.exported = 0
        self.failed = 0
        self.dropped = 0
        self.batches = 0
        self._thread = threading.Thread(target=self._worker, name="otel-guard-export", daemon=True)
        self._thread.start()

    # SpanProcessor interface ---------------------------------------------------------------
    def on_start(self, span: Any, parent_context: Any = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        # Every span of a guarded trace comes here, on the agent's thread: a deque append (atomic
        # under the GIL), and the lock only to wake an idle worker (once per batch, not per
        # span) or to count a drop.
        if self._stopped:
            return
        ctx = span.context
        if self._filter is not None and (ctx is None or not self._filter(ctx.trace_id)):
            return
        queue = self._queue
        if len(queue) >= self._queue_size:  # a bound, exceeded by at most one span per thread
            with self._cond:
                self.dropped += 1
            return
        queue.append(span)
        # Read after the append: a worker that set _idle before we appended is woken here; one
        # that sets it later sees the span when it checks the queue (no lost wake-up).
        if self._idle:
            with self._cond:
                self._cond.notify()

    def shutdown(self, flush_timeout_ms: float = 2000) -> None:
        """Flush, stop the worker, shut the exporter down. Exactly once: the SDK closes it and
        the application's TracerProvider (at exit) shuts it down again, possibly from
        another thread; a second exporter.shutdown() would log "already shutdown"."""
        with self._shutdown_lock:
            if self._shut:
                return
            self._shut = True
        if self._stopped:  # a forked child's copy: no worker, and the channel is the parent's
            return
        self.force_flush(flush_timeout_ms)
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)
        if self._thread.is_alive():
            # Still exporting to a slow guard: shutting the exporter down under it would
            # only turn that export into an error. The daemon thread ends with the process.
            log.debug("otel-guard: span export still running at shutdown; exporter left open")
            return
        try:
            self._exporter.shutdown()
        except Exception:  # pragma: no cover - exporter bugs must not reach the agent
            log.debug("exporter shutdown failed", exc_info=True)

    def force_flush(self, timeout_millis: int | float = 30_000) -> bool:
        deadline = time.monotonic() + timeout_millis / 1000.0
        with self._cond:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    # worker -----------------------------------------------------------------------------------
    def _worker(self) -> None:
        while True:
            with self._cond:
                self._idle = True  # first, then the queue check: see on_end
                while not self._queue and not self._stopped:
                    self._cond.wait()
                self._idle = False
                if self._stopped and not self._queue:
                    return
            if self._delay_s:
                # Coalesce spans that end together (a tool batch, step end + run end).
                time.sleep(self._delay_s)
            with self._cond:
                n = min(len(self._queue), self._max_batch)
                batch = [self._queue.popleft() for _ in range(n)]
                self._busy = True
            try:
                self._export(batch)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _export(self, batch: Sequence[ReadableSpan]) -> None:
        try:
            result = self._exporter.export(batch)
        except Exception as exc:
            self.failed += len(batch)
            log.warning("otel-guard span export failed: %s", type(exc).__name__)
            return
        self.batches += 1
        if result is SpanExportResult.SUCCESS:
            self.exported += len(batch)
        else:
            self.failed += len(batch)
            log.debug("otel-guard span export returned %s", result)


def channel_credentials(settings: Settings) -> grpc.ChannelCredentials:
    """TLS credentials for the connections to the guard: the CA bundle that verifies it
    (system roots without one) and, for mTLS, the client certificate. The files are read on
    every call: the control stream calls this at every (re)connect."""

    def read(path: str | None) -> bytes | None:
        if path is None:
            return None
        with open(path, "rb") as f:
            return f.read()

    return grpc.ssl_channel_credentials(
        root_certificates=read(settings.tls_ca_file),
        private_key=read(settings.tls_key_file),
        certificate_chain=read(settings.tls_cert_file),
    )


def make_otlp_exporter(
    target: str,
    *,
    token: str | None,
    credentials: grpc.ChannelCredentials | None,
    timeout_s: float,
    channel_options: Sequence[tuple[str, Any]] = (),
    retry_unavailable: bool = True,
) -> SpanExporter:
    """The real OTLP/gRPC span exporter pointed at the guard (bearer token in metadata);
    ``credentials=None`` is a plaintext channel. ``retry_unavailable=False``: an unreachable
    guard fails the export at once (the failover export then picks the next guard) instead
    of the exporter retrying it after a 1 s backoff."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    headers = {"authorization": f"Bearer {token}"} if token else None
    return OTLPSpanExporter(
        endpoint=target,
        insecure=credentials is None,
        credentials=credentials,
        headers=headers,
        timeout=timeout_s,
        # its annotation says a 1-tuple; it takes any number of grpc channel options
        channel_options=tuple(channel_options) or None,  # type: ignore[arg-type]
        retryable_error_codes=None if retry_unavailable else _RETRY_BUT_UNAVAILABLE,
    )


# The OTLP exporter's default retryable codes, less UNAVAILABLE.
_RETRY_BUT_UNAVAILABLE = frozenset(
    {
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.DATA_LOSS,
    }
)
