"""Static checks of OpenTelemetry Collector configs (shared by the collector and Helm tests)."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["KNOWN_TYPES", "check_wiring", "duration_s", "guard_exporters"]

# Component types these configs may use (otelcol-contrib >= 0.144 names, plus the deprecated
# aliases older collectors know). A typo in a type name fails here instead of at deploy time.
KNOWN_TYPES = {
    "receivers": {"otlp"},
    "processors": {"memory_limiter", "batch", "filter", "resource", "attributes"},
    "exporters": {
        "otlp_grpc",
        "otlp",
        "otlp_http",
        "otlphttp",
        "load_balancing",
        "loadbalancing",
        "clickhouse",
        "debug",
    },
    "extensions": {"health_check"},
}
_KINDS = ("receivers", "processors", "exporters")
_ENV_REF = re.compile(r"\$\{([^}]*)\}")
_ENV_OK = re.compile(r"^env:[A-Z_][A-Z0-9_]*(:-[^}]*)?$")


def duration_s(value: str) -> float:
    """A collector duration ('20ms', '5s', '1m') in seconds."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ns|us|ms|s|m|h)", str(value).strip())
    if not m:
        raise ValueError(f"not a duration: {value!r}")
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}[m.group(2)]
    return float(m.group(1)) * scale


def check_wiring(cfg: dict[str, Any], text: str = "") -> list[str]:
    """Problems in a collector config's pipeline wiring (empty list = wired correctly)."""
    problems: list[str] = []
    for section, known in KNOWN_TYPES.items():
        for cid in cfg.get(section) or {}:
            if cid.split("/", 1)[0] not in known:
                problems.append(f"{section}.{cid}: unknown component type")
    service = cfg.get("service") or {}
    pipelines = service.get("pipelines") or {}
    if not pipelines:
        problems.append("service.pipelines is empty")
    used: dict[str, set[str]] = {k: set() for k in _KINDS}
    for name, pipe in pipelines.items():
        if name.split("/", 1)[0] not in ("traces", "metrics", "logs"):
            problems.append(f"pipeline {name}: unknown signal")
        for kind in _KINDS:
            refs = pipe.get(kind) or []
            if kind != "processors" and not refs:
                problems.append(f"pipeline {name}: no {kind}")
            for ref in refs:
                if ref not in (cfg.get(kind) or {}):
                    problems.append(f"pipeline {name}: {kind[:-1]} {ref!r} is not defined")
                used[kind].add(ref)
        procs = pipe.get("processors") or []
        if "memory_limiter" in procs and procs[0] != "memory_limiter":
            problems.append(f"pipeline {name}: memory_limiter must come first")
    for kind in ("receivers", "exporters"):
        for cid in cfg.get(kind) or {}:
            if cid not in used[kind]:
                problems.append(f"{kind}.{cid} is defined but in no pipeline")
    for ext in service.get("extensions") or []:
        if ext not in (cfg.get("extensions") or {}):
            problems.append(f"service.extensions: {ext!r} is not defined")
    for ref in _ENV_REF.findall(text):
        if not _ENV_OK.match(ref):
            problems.append(f"bad environment reference ${{{ref}}} (use ${{env:NAME:-default}})")
    return problems


def guard_exporters(cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Exporters that feed the guard (by name), with the OTLP settings they send with."""
    out = {}
    for cid, exp in (cfg.get("exporters") or {}).items():
        kind, _, name = cid.partition("/")
        if name != "guard":
            continue
        if kind in ("load_balancing", "loadbalancing"):
            out[cid] = exp["protocol"]["otlp"]
        else:
            out[cid] = exp
    return out
