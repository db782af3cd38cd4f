"""The collector configs in collector/ parse, are wired correctly and flush fast to the guard."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from _deploy_collector import check_wiring, duration_s, guard_exporters

REPO = Path(__file__).resolve().parents[2]
COLLECTOR = REPO / "collector"
CONFIGS = sorted(COLLECTOR.glob("*.yaml"))

# A span waiting in a batch delays the guard's cancel by that much; the cancel-latency goal is
# p50 <= 15 ms / p99 <= 50 ms end to end, so the collector hop must not add a 200 ms default.
MAX_GUARD_FLUSH_S = 0.05


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_expected_configs_exist():
    assert {p.name for p in CONFIGS} >= {
        "agent-to-guard.yaml",
        "loadbalancing.yaml",
        "clickhouse-raw.yaml",
    }
    readme = (COLLECTOR / "README.md").read_text()
    for p in [*CONFIGS, COLLECTOR / "rotel.env"]:
        assert p.name in readme, f"collector/README.md does not explain {p.name}"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_pipeline_wiring(path):
    assert check_wiring(_load(path), path.read_text()) == []


def test_wiring_check_catches_mistakes():
    bad = {
        "receivers": {"otlp": {}},
        "processors": {"memory_limiter": {}, "batch": {}},
        "exporters": {"otlp_grpc/guard": {}, "otlp_grcp/typo": {}},
        "service": {
            "pipelines": {
                "traces": {
                    "receivers": ["otlp"],
                    "processors": ["batch", "memory_limiter"],
                    "exporters": ["otlp_grpc/missing"],
                }
            }
        },
    }
    problems = "\n".join(check_wiring(bad, "endpoint: ${OTEL_GUARD_ENDPOINT}"))
    assert "otlp_grcp/typo: unknown component type" in problems
    assert "'otlp_grpc/missing' is not defined" in problems
    assert "memory_limiter must come first" in problems
    assert "exporters.otlp_grpc/guard is defined but in no pipeline" in problems
    assert "bad environment reference" in problems


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_guard_path_flushes_fast(path):
    cfg = _load(path)
    exporters = guard_exporters(cfg)
    assert exporters, f"{path.name}: no exporter named */guard"
    for cid, otlp in exporters.items():
        queue = otlp["sending_queue"]
        assert queue["enabled"] is True
        assert duration_s(queue["batch"]["flush_timeout"]) <= MAX_GUARD_FLUSH_S, cid
        assert otlp["compression"] == "none", cid
        assert duration_s(otlp["timeout"]) <= 5, cid
        # Legacy batch processor in a guard pipeline would add its own (200 ms default) wait.
        for pipe in cfg["service"]["pipelines"].values():
            if cid in pipe["exporters"]:
                for proc in pipe.get("processors") or []:
                    if proc.split("/")[0] == "batch":
                        timeout = (cfg["processors"][proc] or {}).get("timeout", "200ms")
                        assert duration_s(timeout) <= MAX_GUARD_FLUSH_S, proc


def test_load_balancing_routes_by_trace_id_to_the_headless_service():
    cfg = _load(COLLECTOR / "loadbalancing.yaml")
    lb = cfg["exporters"]["load_balancing/guard"]
    assert lb["routing_key"] == "traceID"
    assert list(lb["resolver"]) == ["dns"], "exactly one resolver"
    dns = lb["resolver"]["dns"]
    assert "headless" in dns["hostname"] and str(dns["port"]) == "4317"
    assert duration_s(dns["interval"]) <= 30
    # The per-replica exporters must not retry (the load balancer re-routes instead).
    assert lb["protocol"]["otlp"]["retry_on_failure"]["enabled"] is False
    assert lb["retry_on_failure"]["enabled"] is True
    assert "endpoint" not in lb["protocol"]["otlp"]


def test_clickhouse_raw_batches_big_and_keeps_the_guard_fast():
    cfg = _load(COLLECTOR / "clickhouse-raw.yaml")
    ch = cfg["exporters"]["clickhouse"]
    assert ch["database"] != "otel_guard", "raw spans stay out of the guard's database"
    assert ch["traces_table_name"] == "otel_traces"
    batch = ch["sending_queue"]["batch"]
    assert duration_s(batch["flush_timeout"]) >= 1 and batch["min_size"] >= 1000
    pipes = cfg["service"]["pipelines"]
    to_guard = [p for p in pipes.values() if "otlp_grpc/guard" in p["exporters"]]
    to_ch = [p for p in pipes.values() if "clickhouse" in p["exporters"]]
    assert to_guard and to_ch
    assert all(p["receivers"] == ["otlp"] for p in pipes.values())
