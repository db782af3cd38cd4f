"""``guard.metrics`` in the policy file: where the guard exports its own metrics.

The guard's metrics (spans, decisions, delivery latency, loop lag, live runs per tenant,
store counters; listed under "Guard metrics" in the operations guide) go to a Prometheus scrape endpoint (``listen``), to an
OTLP metrics receiver such as a collector (``otlp_endpoint``), to both, or nowhere (the
default). ``otel-guard serve`` flags of the same names override the file. Pure parsing: the
server starts the exporters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from guard.errors import ConfigError
from guard.policy._parse import check_keys, opt_int, req_float, req_mapping, req_str

__all__ = ["MAX_TOP_TENANTS", "MetricsSettings", "parse_metrics", "split_host_port"]

MAX_TOP_TENANTS = 1000  # per-tenant series of one guard: the cardinality stays bounded


@dataclass(frozen=True, slots=True)
class MetricsSettings:
    """``listen``: HOST:PORT of the Prometheus endpoint (``None`` = none); ``otlp_endpoint``:
    ``http://`` (plaintext) or ``https://`` gRPC OTLP endpoint (``None`` = none), exported every
    ``otlp_interval_s``; ``top_tenants``: live runs are labelled by tenant for the N tenants
    with the most runs, the rest are summed under ``tenant="(other)"``."""

    listen: str | None = None
    otlp_endpoint: str | None = None
    otlp_interval_s: float = 15.0
    top_tenants: int = 20

    @property
    def enabled(self) -> bool:
        return self.listen is not None or self.otlp_endpoint is not None


def split_host_port(value: str, path: str) -> tuple[str, int]:
    """``"127.0.0.1:9464"`` / ``"[::1]:0"`` -> (host, port); ConfigError when malformed."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"must be HOST:PORT (port 0-65535), got {value!r}", path=path)
    return host.strip("[]"), int(port)


def parse_metrics(data: Any, path: str) -> MetricsSettings:
    """Validate a ``guard.metrics`` mapping (``None`` = metrics off)."""
    if data is None:
        return MetricsSettings()
    d: Mapping[str, Any] = req_mapping(data, path)
    check_keys(d, {f.name for f in fields(MetricsSettings)}, path)
    kw: dict[str, Any] = {}
    if d.get("listen") is not None:
        kw["listen"] = req_str(d["listen"], f"{path}.listen")
        split_host_port(kw["listen"], f"{path}.listen")
    if d.get("otlp_endpoint") is not None:
        endpoint = req_str(d["otlp_endpoint"], f"{path}.otlp_endpoint")
        if not endpoint.startswith(("http://", "https://")):
            raise ConfigError(
                f"must start with http:// (plaintext) or https:// (TLS), got {endpoint!r}",
                path=f"{path}.otlp_endpoint",
            )
        kw["otlp_endpoint"] = endpoint
    if "otlp_interval_s" in d:
        kw["otlp_interval_s"] = req_float(
            d["otlp_interval_s"], f"{path}.otlp_interval_s", minimum=0.0, exclusive=True
        )
    if "top_tenants" in d:
        top = opt_int(d["top_tenants"], f"{path}.top_tenants", maximum=MAX_TOP_TENANTS)
        if top is None:
            raise ConfigError("must be an int >= 0, not null", path=f"{path}.top_tenants")
        kw["top_tenants"] = top
    return MetricsSettings(**kw)
