"""The SDK's span export over several guards (or several ``span_endpoint`` entries).

Two modes, chosen by the settings:

- **following** (no ``span_endpoint``): each batch goes to the guard that holds the control
  stream now (:class:`guard.sdk._targets.Route`), so a run's spans reach the guard its stream
  re-registered it on. Before the stream was ever established, batches go to the first
  ``endpoint`` entry (``targets``), as with a single guard. A failed export waits, at most ``wait_s``, for the control stream to
  be established again (on the next guard, or the same one back) and sends the batch there
  once; the guard does not count a span twice (``guard.seq`` against the re-registration's
  ``span_seq``). The per-target OTLP exporters do not retry ``UNAVAILABLE`` themselves: a
  dead guard fails the batch at once and the failover decides where it goes.
- **rotating** (``span_endpoint`` lists several): start at a per-process random entry; a
  failed export moves to the next entry and is sent there once (here too without the OTLP
  exporter's own ``UNAVAILABLE`` retry).

One real OTLP exporter per address, built when first used. Export errors are counted by the
caller (``LowLatencySpanProcessor``), never raised into the agent.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from guard.sdk._targets import Address, Route

__all__ = ["FailoverSpanExporter"]

log = logging.getLogger("guard.sdk.export")
_MAX_EXPORTERS = 16  # a name whose addresses keep changing does not grow this without bound


class FailoverSpanExporter(SpanExporter):
    """A SpanExporter that sends each batch to one of several addresses (see the module)."""

    def __init__(
        self,
        make: Callable[[Address], SpanExporter],
        *,
        route: Route | None = None,
        targets: Sequence[Address] = (),
        wait_s: float = 2.0,
    ) -> None:
        if route is None and not targets:
            raise ValueError("FailoverSpanExporter needs a route or targets")
        # rotating: the entries; following: the first endpoint entry, until a stream is up
        self._make = make
        self._route = route
        self._targets = list(targets)
        self._i = random.randrange(len(self._targets)) if self._targets else 0
        self._wait_s = wait_s
        self._exporters: collections.OrderedDict[str, SpanExporter] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._shut = False
        self.failovers = 0  # batches sent again to another address after a failed export

    def _exporter(self, addr: Address) -> SpanExporter:
        with self._lock:
            exp = self._exporters.get(addr.target)
            if exp is not None:
                self._exporters.move_to_end(addr.target)
                return exp
            exp = self._exporters[addr.target] = self._make(addr)
            old = (
                self._exporters.popitem(last=False)[1]
                if len(self._exporters) > _MAX_EXPORTERS
                else None
            )
        if old is not None:
            _quiet_shutdown(old)
        return exp

    def targets(self) -> list[str]:
        """The addresses exported to so far (the most recently used last)."""
        with self._lock:
            return list(self._exporters)

    def _send(self, addr: Address, batch: Sequence[Any]) -> SpanExportResult:
        try:
            return self._exporter(addr).export(batch)
        except Exception:  # an exporter bug must not end the export thread
            log.debug("otel-guard: span export to %s raised", addr.target, exc_info=True)
            return SpanExportResult.FAILURE

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        if self._shut:
            return SpanExportResult.FAILURE
        if self._route is not None:
            return self._export_following(self._route, spans)
        return self._export_rotating(spans)

    def _export_following(self, route: Route, spans: Sequence[Any]) -> SpanExportResult:
        addr, up, generation = route.state()
        if not up and generation == 0 and self._targets:
            addr = self._targets[0]  # no stream yet (or a guard that only takes OTLP)
        elif addr is None or not up:  # between two guards: wait for the next one's Welcome
            addr = route.wait_newer(generation, self._wait_s)
            if addr is None:
                return SpanExportResult.FAILURE
            generation = route.state()[2]
        result = self._send(addr, spans)
        if result is SpanExportResult.SUCCESS or self._shut:
            return result
        nxt = route.wait_newer(generation, self._wait_s)
        if nxt is None:
            return result
        self.failovers += 1
        return self._send(nxt, spans)

    def _export_rotating(self, spans: Sequence[Any]) -> SpanExportResult:
        addr = self._targets[self._i]
        result = self._send(addr, spans)
        if result is SpanExportResult.SUCCESS or len(self._targets) == 1 or self._shut:
            return result
        self._i = (self._i + 1) % len(self._targets)
        self.failovers += 1
        return self._send(self._targets[self._i], spans)

    def shutdown(self) -> None:
        self._shut = True
        with self._lock:
            exporters = list(self._exporters.values())
            self._exporters.clear()
        for exp in exporters:
            _quiet_shutdown(exp)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def _quiet_shutdown(exp: SpanExporter) -> None:
    try:
        exp.shutdown()
    except Exception:  # pragma: no cover - exporter bugs must not reach the agent
        log.debug("exporter shutdown failed", exc_info=True)
