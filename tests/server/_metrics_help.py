"""Helpers for the guard-metrics tests: a real HTTP scrape, parsed by prometheus_client's own
parser, and a real OTLP MetricsService receiver on 127.0.0.1:0."""

from __future__ import annotations

import asyncio
import threading
import urllib.request
from concurrent import futures
from typing import Any

import grpc
from _wait import wait_until_async
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["MetricsReceiver", "Scrape", "scrape"]


class Scrape:
    """One scrape: ``samples`` as (name, labels, value)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples = [
            (s.name, dict(s.labels), s.value) for f in self.families.values() for s in f.samples
        ]

    def value(self, name: str, **labels: str) -> float | None:
        """Sum of the samples named ``name`` whose labels include ``labels``."""
        hits = [
            v
            for n, lab, v in self.samples
            if n == name and all(lab.get(k) == want for k, want in labels.items())
        ]
        return sum(hits) if hits else None

    def names(self) -> set[str]:
        return {n for n, _, _ in self.samples}


def _get(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as resp:
        assert resp.status == 200
        return resp.read().decode()


async def scrape(address: str) -> Scrape:
    """A real HTTP GET, off the event loop (the guard under test may share it)."""
    return Scrape(await asyncio.to_thread(_get, address))


async def scrape_until(address: str, pred, timeout_s: float = 10.0) -> Scrape:
    """Scrape until ``pred(scrape)`` holds (bounded) and return that scrape; fails with the
    last scrape's text when it never does."""
    last: list[Scrape] = []

    async def holds() -> Scrape | None:
        last[:] = [await scrape(address)]
        return last[0] if pred(last[0]) else None

    return await wait_until_async(
        holds,
        timeout_s,
        lambda: f"a scrape of {address} matching {pred}; last: {last[0].text[-400:]!r}",
        interval_s=0.05,
    )


class MetricsReceiver(metrics_service_pb2_grpc.MetricsServiceServicer):
    """``opentelemetry.proto.collector.metrics.v1.MetricsService/Export`` on 127.0.0.1:0."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self._cond = threading.Condition()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def Export(self, request: Any, context: Any) -> Any:
        with self._cond:
            self.requests.append(request)
            self._cond.notify_all()
        return metrics_service_pb2.ExportMetricsServiceResponse()

    def latest(self) -> dict[str, tuple[dict[str, Any], Any]]:
        """metric name -> (resource attributes, Metric) from the newest request holding it."""
        out: dict[str, tuple[dict[str, Any], Any]] = {}
        with self._cond:
            requests = list(self.requests)
        for req in requests:
            for rm in req.resource_metrics:
                res = {kv.key: kv.value.string_value for kv in rm.resource.attributes}
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        out[m.name] = (res, m)
        return out

    async def wait_for(self, pred, timeout_s: float = 10.0) -> bool:
        """Until ``pred(self.latest())`` holds (bounded: fails after ``timeout_s``)."""
        what = f"an OTLP metrics export matching {getattr(pred, '__name__', pred)}"
        await wait_until_async(lambda: pred(self.latest()), timeout_s, what, interval_s=0.05)
        return True

    def stop(self) -> None:
        self.server.stop(0)
