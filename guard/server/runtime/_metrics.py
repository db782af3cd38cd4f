"""The guard's own metrics, through the OpenTelemetry metrics SDK: a Prometheus scrape
endpoint and/or periodic OTLP export (``guard.metrics`` in the policy file, or the
``--metrics-*`` flags of ``otel-guard serve``). The operations guide ("Guard metrics") lists every name.

Cost: the ingest path pays nothing per span. Counts the registry and the store keep anyway
(``Registry.stats``, ``Store.counters()``, ``by_tenant``) are read by observable instruments
when a reader collects (a scrape, an OTLP export), on the collecting thread: each read is one
copy of a dict or a ``len`` (single C-level operations under the GIL), so it needs no hop
onto the event loop and answers even while the loop is stuck. Only events with no counter
of their own are recorded as they happen: a decision as it is written (its kind, reason and
delivery latency) and each event-loop lag sample (100 a second).

Every series carries the replica: ``guard.id`` is a resource attribute (OTLP) and a label
``guard_id`` on every Prometheus series. Live runs are labelled by tenant for the
``top_tenants`` tenants with the most live runs; the rest are summed as ``tenant="(other)"``,
so one guard exports at most ``top_tenants + 1`` such series whatever the tenants on the wire.

Redis figures (round trips, errors, fail-open periods) are exported once a Redis component
exists to report them: it takes :meth:`GuardMetrics.redis` (or :data:`NO_REDIS_TELEMETRY`
when metrics are off) and calls the :class:`RedisTelemetry` methods; their instruments are
created on that first call, so a guard without Redis exports none.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from guard.errors import GuardUnavailable
from guard.policy import MetricsSettings, Reason
from guard.policy._telemetry import split_host_port
from guard.server._host import GuardHost
from guard.server.control._clocks import skew_figures
from guard.store._records import DecisionRecord

__all__ = ["NO_REDIS_TELEMETRY", "OTHER_TENANTS", "GuardMetrics", "RedisTelemetry", "top_tenants"]

log = logging.getLogger("guard.server.metrics")

OTHER_TENANTS = "(other)"  # live runs of the tenants outside the top N
NO_TENANT = "(none)"  # runs without a tenant id
_ACTIONS = frozenset({"warn", "wrap_up", "cancel", "deny"})
_REASONS = frozenset(r.value for r in Reason)
# Seconds. Delivery: a decision is pushed within a few ms; acks after ACK_TIMEOUT_S never come.
_LATENCY_BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_LAG_BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_STORE_OUTCOMES = (
    "queued", "written", "spooled", "replayed", "dropped", "dead_lettered", "deduplicated",
    # record claims across replicas (guard.store._claims): held by another replica, stored
    # while Redis was unreachable, and stored by two replicas (found after an outage)
    "records_claimed_elsewhere", "records_unclaimed", "records_claim_conflicts",
)  # fmt: skip
_ALLOWANCES = (("granted", "allowance_grants"), ("exhausted", "allowance_exhausted"),
               ("unknown", "allowance_unknown"))  # fmt: skip


def top_tenants(by_tenant: dict[str, Any], n: int) -> list[tuple[str, int]]:
    """(tenant label, live runs) for the ``n`` tenants with the most runs (ties by name),
    then ``(other)`` with the rest (always present, 0 when there is none)."""
    counts = [(t or NO_TENANT, len(runs)) for t, runs in list(by_tenant.items())]
    best = heapq.nsmallest(n, (c for c in counts if c[1]), key=lambda c: (-c[1], c[0]))
    rest = sum(c[1] for c in counts) - sum(c[1] for c in best)
    return [*best, (OTHER_TENANTS, rest)]


def _seconds_histogram(meter: Any, name: str, text: str, bounds: tuple[float, ...]) -> Any:
    return meter.create_histogram(
        name, unit="s", description=text, explicit_bucket_boundaries_advisory=bounds
    )


class RedisTelemetry:
    """What a Redis component reports: round trips, errors and fail-open periods."""

    def __init__(self, meter: Any) -> None:
        self._rtt = _seconds_histogram(
            meter,
            "otel_guard.redis.round_trip",
            "Redis round-trip time per operation (EVALSHA script, publish, ...)",
            _LATENCY_BOUNDS,
        )
        self._errors = meter.create_counter(
            "otel_guard.redis.errors", unit="{error}", description="Redis operations that failed"
        )
        self._periods = meter.create_counter(
            "otel_guard.fail_open.periods",
            unit="{period}",
            description="times Redis became unreachable and the guard enforced local windows",
        )
        self.fail_open_active = False
        meter.create_observable_gauge(
            "otel_guard.fail_open.active",
            callbacks=[lambda _o: [Observation(int(self.fail_open_active))]],
            unit="1",
            description="1 while the guard runs on local windows because Redis is unreachable",
        )

    def round_trip(self, seconds: float, op: str) -> None:
        self._rtt.record(seconds, {"op": op})

    def error(self, error_type: str) -> None:
        self._errors.add(1, {"error.type": error_type})

    def fail_open(self, active: bool) -> None:
        """Call on every change; a period is counted when one begins."""
        if active and not self.fail_open_active:
            self._periods.add(1)
        self.fail_open_active = active


class _NoRedisTelemetry(RedisTelemetry):
    def __init__(self) -> None:
        self.fail_open_active = False

    def round_trip(self, seconds: float, op: str) -> None:
        return None

    def error(self, error_type: str) -> None:
        return None

    def fail_open(self, active: bool) -> None:
        self.fail_open_active = active


NO_REDIS_TELEMETRY: RedisTelemetry = _NoRedisTelemetry()


class GuardMetrics:
    """The metrics of one GuardServer (``app``). ``start()`` on the server's loop; ``shutdown``
    exports a last time (OTLP) and closes the scrape endpoint."""

    def __init__(self, app: GuardHost, settings: MetricsSettings) -> None:
        self.app = app
        self.settings = settings
        self.address: str | None = None  # HOST:PORT of the scrape endpoint once started
        self._http: Any = None
        self._redis: RedisTelemetry | None = None
        readers: list[MetricReader] = []
        if settings.listen is not None:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import CollectorRegistry

            self._prom_registry = CollectorRegistry(auto_describe=False)  # this guard's own
            readers.append(
                PrometheusMetricReader(
                    scope_info_enabled=False,
                    resource_attribute_filter=lambda key: key == "guard.id",
                    registry=self._prom_registry,
                )
            )
        if settings.otlp_endpoint is not None:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

            timeout_s = min(10.0, max(1.0, settings.otlp_interval_s))
            exporter = OTLPMetricExporter(
                endpoint=settings.otlp_endpoint,
                insecure=settings.otlp_endpoint.startswith("http://"),
                timeout=timeout_s,
            )
            readers.append(
                PeriodicExportingMetricReader(
                    exporter,
                    export_interval_millis=settings.otlp_interval_s * 1000.0,
                    export_timeout_millis=timeout_s * 1000.0,
                )
            )
        resource = Resource.create(
            {
                "service.name": "otel-guard",
                "service.instance.id": app.guard_id,
                "guard.id": app.guard_id,
            }
        )
        self.provider = MeterProvider(metric_readers=readers, resource=resource)
        self.meter = self.provider.get_meter("otel-guard")
        self._instruments()

    # -- instruments ----------------------------------------------------------------------
    def _instruments(self) -> None:
        m = self.meter
        app = self.app
        registry = app.registry

        def stat(key: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
            return lambda _o: [Observation(registry.stats.get(key, 0))]

        counter, gauge = m.create_observable_counter, m.create_observable_gauge
        observed: list[tuple[Any, str, str, Callable[..., Any], str]] = [
            (counter, "otel_guard.spans.received", "{span}", stat("spans"),
             "spans in accepted Export requests"),
            (counter, "otel_guard.spans.refused", "{span}", stat("rejected_spans"),
             "spans refused one by one (partial_success: bad counters, another tenant's run, "
             "capacity)"),
            (counter, "otel_guard.records.acked", "{record}", stat("records_acked"),
             "RecordAcks sent"),
            (counter, "otel_guard.records.unacked", "{record}", stat("records_unacked"),
             "refused acknowledgements: times a run record could not be made durable "
             "(disk full), so it was not acked; it is offered again (the agent keeps it)"),
            (counter, "otel_guard.records.rejected", "{record}", stat("records_rejected"),
             "RunEnded records refused one by one (Reject sent, dead-lettered)"),
            (counter, "otel_guard.control.rejected", "{message}", self._control_rejects,
             "control messages other than RunEnded refused one by one (Reject sent), by kind"),
            (gauge, "otel_guard.agent.clock_skew.max", "s",
             lambda _o: [Observation(skew_figures(registry.sessions)[
                 "clock_skew_live_max_abs_s"])],
             "largest absolute agent clock skew over the attached agent sessions"),
            (gauge, "otel_guard.agent.clock_skewed_sessions", "{session}",
             lambda _o: [Observation(skew_figures(registry.sessions)[
                 "sessions_clock_skewed_live"])],
             "attached agent sessions whose clock is more than 60 s off the guard's"),
            (counter, "otel_guard.decisions.dropped", "{decision}", stat("decisions_dropped"),
             "decision records lost because the record sink raised"),
            (counter, "otel_guard.agents.lost", "{run}", stat("agent_lost"),
             "runs ended as agent_lost"),
            (counter, "otel_guard.capacity.rejections", "{run}", stat("capacity_rejections"),
             "runs refused because max_tracked_runs was reached"),
            (counter, "otel_guard.export.refused", "{request}", self._refusals,
             "Export requests refused whole, by gRPC status (error.type)"),
            (counter, "otel_guard.export.shed", "{request}", stat("span_requests_shed"),
             "Export requests shed because their tenant's share of the span queue was full "
             "(RESOURCE_EXHAUSTED / 429 with a retry delay; exporters resend them)"),
            (gauge, "otel_guard.span_queue.size", "By",
             lambda _o: [Observation(app.intake.figures()["span_queue_bytes"])],
             "bytes of span requests queued for the applier"),
            (counter, "otel_guard.allowances", "{grant}", self._allowances,
             "tenant allowance requests by outcome (granted, exhausted, unknown)"),
            (gauge, "otel_guard.runs.live", "{run}", self._live_runs,
             "live runs by tenant (top tenants; the rest as tenant=(other))"),
            (gauge, "otel_guard.sessions", "{session}",
             lambda _o: [Observation(len(registry.sessions))], "attached agent control streams"),
            (gauge, "otel_guard.loop.lag.recent", "s", self._lag_recent,
             "event-loop lag over the last ~20 s (quantile 0.5, 0.99, 1 = max)"),
        ]  # fmt: skip
        if callable(getattr(app.sink, "counters", None)):
            observed += [
                (counter, "otel_guard.store.records", "{record}", self._store_records,
                 "store records by outcome (queued, written, spooled, replayed, dropped, "
                 "dead_lettered, deduplicated)"),
                (gauge, "otel_guard.store.pending", "{record}",
                 lambda _o: [Observation(app.sink.counters().get("pending", 0))],
                 "records queued in memory for the store's writer"),
                (gauge, "otel_guard.store.disk_full", "1",
                 lambda _o: [Observation(app.sink.counters().get("disk_full", 0))],
                 "1 while the store cannot write its data dir (new run records are not "
                 "acknowledged; acknowledged ones wait in memory, store.held)"),
            ]  # fmt: skip
        for create, name, unit, callback, text in observed:
            create(name, callbacks=[callback], unit=unit, description=text)
        self._decisions = m.create_counter(
            "otel_guard.decisions",
            unit="{decision}",
            description="decisions written, by action, reason and whether the agent acked",
        )
        self._delivery = _seconds_histogram(
            m,
            "otel_guard.decision.delivery_latency",
            "decision sent -> agent's ack",
            _LATENCY_BOUNDS,
        )
        self._lag = _seconds_histogram(
            m, "otel_guard.loop.lag", "how late the event loop ran a 10 ms timer", _LAG_BOUNDS
        )

    def _refusals(self, _o: CallbackOptions) -> list[Observation]:
        return [
            Observation(n, {"error.type": k}) for k, n in dict(self.app.export_refusals).items()
        ]

    def _control_rejects(self, _o: CallbackOptions) -> list[Observation]:
        stats = dict(self.app.registry.stats)
        return [
            Observation(n, {"message": k[17:]})
            for k, n in stats.items()
            if k.startswith("control_rejected_")
        ]

    def _allowances(self, _o: CallbackOptions) -> list[Observation]:
        stats = dict(self.app.registry.stats)
        return [Observation(stats.get(key, 0), {"outcome": name}) for name, key in _ALLOWANCES]

    def _live_runs(self, _o: CallbackOptions) -> list[Observation]:
        rows = top_tenants(self.app.registry.by_tenant, self.settings.top_tenants)
        return [Observation(n, {"tenant": t}) for t, n in rows]

    def _lag_recent(self, _o: CallbackOptions) -> list[Observation]:
        f = self.app.loop_lag.figures()
        return [
            Observation(f["loop_lag_p50_ms"] / 1000.0, {"quantile": "0.5"}),
            Observation(f["loop_lag_p99_ms"] / 1000.0, {"quantile": "0.99"}),
            Observation(f["loop_lag_recent_max_ms"] / 1000.0, {"quantile": "1"}),
        ]

    def _store_records(self, _o: CallbackOptions) -> list[Observation]:
        c = self.app.sink.counters()
        return [Observation(c.get(k, 0), {"outcome": k}) for k in _STORE_OUTCOMES]

    # -- events ---------------------------------------------------------------------------
    def decision_written(self, record: DecisionRecord, latency_ms: float | None) -> None:
        try:
            action = record.action if record.action in _ACTIONS else "other"
            reason = record.reason if record.reason in _REASONS else "other"
            delivered = latency_ms is not None
            self._decisions.add(1, {"action": action, "reason": reason, "delivered": delivered})
            if latency_ms is not None:
                self._delivery.record(latency_ms / 1000.0, {"action": action})
        except Exception:  # the guard's metrics never break the guard
            log.debug("decision metric failed", exc_info=True)

    def lag_sample(self, lag_ms: float) -> None:
        try:
            self._lag.record(lag_ms / 1000.0)
        except Exception:
            log.debug("loop lag metric failed", exc_info=True)

    def redis(self) -> RedisTelemetry:
        """The Redis component's reporting hooks (instruments created on the first call)."""
        if self._redis is None:
            self._redis = RedisTelemetry(self.meter)
        return self._redis

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> GuardMetrics:
        if self.settings.listen is not None:
            from prometheus_client import start_http_server

            host, port = split_host_port(self.settings.listen, "guard.metrics.listen")
            try:
                self._http, _ = start_http_server(port, addr=host, registry=self._prom_registry)
            except OSError as exc:
                self.provider.shutdown(timeout_millis=1000)
                raise GuardUnavailable(
                    f"could not bind the metrics endpoint {self.settings.listen}: {exc}"
                ) from None
            shown = f"[{host}]" if ":" in host else host
            self.address = f"{shown}:{self._http.server_port}"
            log.info("guard metrics on http://%s/metrics", self.address)
        self.app.registry.log.on_write = self.decision_written
        self.app.loop_lag.on_sample = self.lag_sample
        return self

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Blocking (run it off the loop): a last OTLP export, then the endpoint closes."""
        self.app.registry.log.on_write = None
        self.app.loop_lag.on_sample = None
        try:
            self.provider.shutdown(timeout_millis=timeout_s * 1000.0)
        except Exception:
            log.warning("guard metrics did not shut down cleanly", exc_info=True)
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
