"""Redaction on the SDK's path to the guard: no content leaves the process that way.

:class:`RedactingSpanExporter` wraps the exporter to the guard. Before each batch goes out,
every span is checked against the content table of :mod:`guard.semconv`: content attributes
are dropped, GenAI content events are dropped whole, other events lose their content
attributes, and an error status keeps its code but loses its description (the exception
text). Everything else (token counters, cost, model and operation names, ids, ``guard.*``)
goes out unchanged. Whoever wrote the span: our own, OpenLLMetry's, OpenInference's, ...

The check runs on the export thread, not in the agent's ``span.end()``, and a span with
nothing to drop is forwarded as it is: its attribute keys are tested against a set of keys
already known to be clean (one C-level pass), which is all our own spans cost. A span with
content is *copied* without it: the ``ReadableSpan`` is shared with the application's own
processors and exporters, which keep seeing every attribute.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Status

from guard.semconv import is_content_attribute, is_content_event

__all__ = ["RedactingSpanExporter", "copy_span", "redact_span"]

# Attribute keys seen and found clean. Bounded like semconv's verdict cache: a foreign
# instrumentation with per-call keys must not grow it without end.
_CLEAN: set[str] = set()
_CLEAN_MAX = 4096


def _clean(attrs: Mapping[str, Any]) -> bool:
    """True when no key of ``attrs`` is a content attribute (remembers the clean keys)."""
    if _CLEAN.issuperset(attrs):
        return True
    found = False
    for key in attrs:
        if is_content_attribute(key):
            found = True
        elif key not in _CLEAN:
            if len(_CLEAN) >= _CLEAN_MAX:
                _CLEAN.clear()
            _CLEAN.add(key)
    return not found


def _without_content(attrs: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    kept = {k: v for k, v in attrs.items() if not is_content_attribute(k)}
    return kept, len(attrs) - len(kept)


class Redaction:
    """What :func:`redact_span` removed from one span."""

    __slots__ = ("attributes", "events")

    def __init__(self) -> None:
        self.attributes = 0  # attributes dropped (span and event attributes, status text)
        self.events = 0  # events dropped whole


def _parts(span: ReadableSpan) -> tuple[Mapping[str, Any], Sequence[Event]]:
    """The span's attributes and events without the public properties' per-call copies (a
    read-only proxy and a tuple made under a lock: most of the cost of a clean span), read
    from the SDK's containers when they are the usual ones. An ended span's are final."""
    try:
        attrs = span._attributes._dict  # type: ignore[union-attr]  # BoundedAttributes
    except AttributeError:
        attrs = span.attributes or {}
    try:
        events = span._events._dq  # type: ignore[attr-defined]  # BoundedList
    except AttributeError:
        events = span.events
    return attrs, events


def redact_span(span: ReadableSpan, counts: Redaction | None = None) -> ReadableSpan:
    """``span`` itself when it carries no content, else a copy without it."""
    attrs, events = _parts(span)
    status = span.status
    if _clean(attrs) and not status.description:
        for ev in events:
            if is_content_event(ev.name) or (ev.attributes and not _clean(ev.attributes)):
                break
        else:
            return span  # the common case: nothing to drop, nothing copied
    counts = counts if counts is not None else Redaction()
    kept, n = _without_content(attrs)
    counts.attributes += n
    kept_events = []
    for ev in events:
        if is_content_event(ev.name):
            counts.events += 1
            continue
        ev_attrs = ev.attributes or {}
        if ev_attrs and not _clean(ev_attrs):
            ev_attrs, n = _without_content(ev_attrs)
            counts.attributes += n
            ev = Event(ev.name, ev_attrs, ev.timestamp)
        kept_events.append(ev)
    if status.description:
        counts.attributes += 1
        status = Status(status.status_code)
    return copy_span(span, kept, events=tuple(kept_events), status=status)


def copy_span(
    span: ReadableSpan,
    attributes: Mapping[str, Any],
    *,
    events: Sequence[Event] | None = None,
    status: Status | None = None,
) -> ReadableSpan:
    """A copy of an ended span with other attributes (and events, status), for the export to
    the guard only: the application's processors keep the original."""
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=attributes,
        events=span.events if events is None else events,
        links=span.links,
        kind=span.kind,
        status=span.status if status is None else status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


class RedactingSpanExporter(SpanExporter):
    """Exports through ``exporter`` with the content of every span removed (module doc).

    Counters: ``redacted_spans`` (spans copied without content), ``redacted_attributes``,
    ``redacted_events``. A redaction error drops the batch (counted as failed by the caller)
    rather than send it unredacted.
    """

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter
        self.redacted_spans = 0
        self.redacted_attributes = 0
        self.redacted_events = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        out: list[ReadableSpan] | None = None
        counts = Redaction()
        for i, span in enumerate(spans):
            r = redact_span(span, counts)
            if r is not span:
                self.redacted_spans += 1
                if out is None:
                    out = list(spans[:i])
            if out is not None:
                out.append(r)
        if out is not None:
            self.redacted_attributes += counts.attributes
            self.redacted_events += counts.events
        return self.exporter.export(spans if out is None else out)

    def counters(self) -> dict[str, int]:
        return {
            "redacted_spans": self.redacted_spans,
            "redacted_attributes": self.redacted_attributes,
            "redacted_events": self.redacted_events,
        }

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.exporter.force_flush(timeout_millis)
