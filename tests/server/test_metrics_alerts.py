"""The alert-rule examples (dashboards/alerts/otel-guard-rules.yaml) name only metrics and labels
a running guard really exports: a real guard with the real store, a real scrape."""

from __future__ import annotations

import re
from pathlib import Path

import grpc
import pytest
import yaml

from guard.policy import MetricsSettings
from guard.server import GuardServer

from ._metrics_help import scrape_until
from .conftest import Agent, config, step_span, tool_span, trace_id_of

RULES = Path(__file__).resolve().parents[2] / "dashboards" / "alerts" / "otel-guard-rules.yaml"
_METRIC = re.compile(r"\b(otel_guard_[a-z0-9_]+)\b(\{[^}]*\})?")
_BY = re.compile(r"\bby\s*\(([^)]*)\)")
_MATCHER = re.compile(r"([a-z_]+)\s*(=~|!~|!=|=)")
# Labels Prometheus queries build themselves (histogram buckets' le comes with the scrape).
_OWN_LABELS = {"le"}


def _rules() -> list[dict]:
    doc = yaml.safe_load(RULES.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert rules
    return rules


def test_rule_file_is_well_formed():
    names = set()
    for rule in _rules():
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["alert"] not in names
        names.add(rule["alert"])
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"]
        expr = rule["expr"]
        assert expr.count("(") == expr.count(")"), rule["alert"]
        assert _METRIC.search(expr), rule["alert"]
        if "for" in rule:
            assert re.fullmatch(r"\d+[smh]", rule["for"])


async def test_every_metric_and_label_in_the_rules_is_exported(tmp_path):
    from guard.store import open_store

    with open_store(None, data_dir=tmp_path, flush_interval_s=0.05) as store:
        settings = MetricsSettings(listen="127.0.0.1:0")
        async with GuardServer(config(), listen="127.0.0.1:0", sink=store, metrics=settings) as srv:
            agent = Agent(srv.address)
            await agent.connect()
            tid = trace_id_of(11)
            await agent.start_run("loop", tid)
            for i in range(1, 8):  # a loop_detected cancel: a delivered decision
                await agent.export(tool_span("loop", tid, "cd" * 16), step_span("loop", tid, i))
                if agent.directives("cancel", "loop"):
                    break
            channel = grpc.aio.insecure_channel(srv.address)
            with pytest.raises(grpc.aio.AioRpcError):
                await channel.unary_unary(
                    "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
                )(b"\x0a\xff", timeout=5)
            await channel.close()
            # What a Redis component reports through its hooks once one runs (see _metrics).
            redis = srv.metrics.redis()
            redis.round_trip(0.001, "evalsha")
            redis.error("TimeoutError")
            redis.fail_open(True)
            got = await scrape_until(
                srv.metrics.address,
                # the loop-lag histogram appears with the monitor's first sample after start
                lambda s: (
                    s.value("otel_guard_decision_delivery_latency_seconds_count") is not None
                    and s.value("otel_guard_loop_lag_seconds_count") is not None
                ),
            )
            await agent.close()
    labels_of: dict[str, set[str]] = {}
    for name, labels, _ in got.samples:
        labels_of.setdefault(name, set()).update(labels)
    for rule in _rules():
        expr = rule["expr"]
        named = _METRIC.findall(expr)
        for metric, matchers in named:
            assert metric in labels_of, f"{rule['alert']}: {metric} is not exported"
            for label, _ in _MATCHER.findall(matchers):
                assert label in labels_of[metric], f"{rule['alert']}: {metric} has no {label}"
        exported = set().union(*(labels_of[m] for m, _ in named)) | _OWN_LABELS
        for group in _BY.findall(expr):
            for label in (x.strip() for x in group.split(",")):
                assert label in exported, f"{rule['alert']}: no series has label {label}"
