"""Third-party spans with no code at all: the real instrumentation packages (OpenLLMetry,
OpenInference, OpenLIT) on the real ``openai`` client, against a local OpenAI-compatible server,
inside ``@guard.run`` with no TracerProvider of the application's own.

Each agent is a process of its own (``_foreign_agent.py``), talking to a real guard here
through a recording proxy. Checked: the run's outcome (``RunStopped.outcome`` or the record),
the guard's termination record, and the guard's own count from the spans (its live view of the
run, ``ListRuns``): each model call counted once, exactly, whoever reported it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _recording_proxy import RecordingProxy

# The one scripted OpenAI-compatible server of the tests (tests/integrations/_llm_server.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integrations"))
from _llm_server import LLMServer, text

from guard.policy import PolicyConfig
from guard.server import MemorySink
from guard.server._app import ServerThread

# The agent processes import these; this one only checks that they are installed (importing
# them here would cost every worker of the suite a second, for nothing it uses).
_MISSING = [
    name
    for name in (
        "openai",
        "opentelemetry.instrumentation.openai",
        "openinference.instrumentation.openai",
    )
    if importlib.util.find_spec(name) is None
]
if _MISSING:
    pytest.skip(f"not installed: {', '.join(_MISSING)}", allow_module_level=True)

TENANT = "acme"
POLICY = {
    "tenants": {TENANT: {"rolling": [{"metric": "tokens", "limit": 10**9, "window_s": 3600}]}}
}
AGENT = Path(__file__).with_name("_foreign_agent.py")
# one call: 100 prompt tokens (30 of them cached), 20 completion tokens (5 of them reasoning)
USAGE = text("ok", input=100, output=20, cached=30, reasoning=5)
# No OpenLIT release installs next to the dev extras, whose frameworks (openai-agents 0.24,
# Pydantic AI 2.68) need openai >= 3: from the metadata of all 175 releases on PyPI (0.0.1 to
# 1.45.0), 1.41.0-1.45.0 require openai>=1.92,<3 and 1.27.0-1.40.3 openai>=1.1.1,<2;
# 0.0.1-1.26.0 name no openai but pin opentelemetry-instrumentation <0.49 (0.45b0-0.48b0),
# where OpenLLMetry 0.62 needs >=0.59b0. OpenLIT is checked where it is installed (pip install
# openlit into an environment without those extras).
_NEEDS_OPENLIT = pytest.mark.skipif(
    importlib.util.find_spec("openlit") is None,
    reason="openlit not installed: no release fits openai>=3 (1.41-1.45 need openai<3, "
    "1.27-1.40.3 openai<2, 0.0.1-1.26 opentelemetry-instrumentation<0.49)",
)
REASONING = {"openllmetry": 5, "openinference": 5, "openlit": 0}  # OpenLIT does not report it


@pytest.fixture
def guard_proxy() -> Iterator[tuple[MemorySink, RecordingProxy]]:
    sink = MemorySink()
    with (
        ServerThread(PolicyConfig.from_dict(POLICY), sink=sink) as srv,
        RecordingProxy(srv.address) as proxy,
    ):
        yield sink, proxy


def run_agent(tmp_path: Path, proxy: RecordingProxy, **cfg: Any) -> dict[str, Any]:
    with LLMServer([USAGE]) as llm:
        out = tmp_path / f"result-{time.monotonic_ns()}.json"
        full = {
            "order": "instrument_first",
            "endpoint": proxy.address,
            "tenant": TENANT,
            "llm": llm.base_url,
            "calls": 3,
            "admin": proxy.address,
            "out": str(out),
            **cfg,
        }
        env = dict(os.environ)
        env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)  # OpenLIT would export there
        proc = subprocess.run(
            [sys.executable, str(AGENT), json.dumps(full)],
            capture_output=True,
            text=True,
            timeout=180,
            env=env,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        result = json.loads(out.read_text())
        result["llm_requests"] = llm.count
        return result


def _record(sink: MemorySink, run_id: str) -> Any:
    assert sink.wait_for(lambda s: s.run(run_id) is not None, 10)
    return sink.run(run_id)


@pytest.mark.parametrize(
    ("instr", "order"),
    [
        ("openllmetry", "instrument_first"),
        ("openllmetry", "configure_first"),
        ("openinference", "instrument_first"),
        ("openinference", "configure_first"),
        pytest.param("openlit", "instrument_first", marks=_NEEDS_OPENLIT),
    ],
)
def test_tokens_of_an_instrumented_client_are_counted_exactly(
    tmp_path: Path, guard_proxy: Any, instr: str, order: str
) -> None:
    sink, proxy = guard_proxy
    res = run_agent(tmp_path, proxy, instr=instr, order=order)
    out = res["outcome"]
    reasoning = 3 * REASONING[instr]
    expected = {"status": "completed", "model_calls": 3, "input_tokens": 300}
    expected |= {"output_tokens": 60, "cached_tokens": 90, "reasoning_tokens": reasoning}
    assert {k: out[k] for k in expected} == expected
    rec = _record(sink, res["run_id"])  # the guard's termination record (ClickHouse's row)
    assert (rec.model_calls, rec.input_tokens, rec.output_tokens) == (3, 300, 60)
    assert (rec.cached_tokens, rec.reasoning_tokens) == (90, reasoning)
    assert rec.cost_usd is not None and rec.cost_usd > 0  # priced from the price book
    assert res["live"] == {"model_calls": 3, "tokens": 360}  # the guard's count: each call once
    assert res["stats"]["foreign_model_calls"] == 3


@pytest.mark.parametrize("instr", ["openllmetry", "openinference"])
def test_model_call_next_to_an_instrumentation_counts_once(
    tmp_path: Path, guard_proxy: Any, instr: str
) -> None:
    # The README quickstart's step.model_call(...) with the response's usage, and an
    # instrumentation reporting the same call (OpenInference spans have no response id), with
    # the application's own TracerProvider, so the instrumentation's spans reach the guard too.
    sink, proxy = guard_proxy
    res = run_agent(tmp_path, proxy, instr=instr, explicit=True, app_provider=True)
    out = res["outcome"]
    assert (out["model_calls"], out["input_tokens"], out["output_tokens"]) == (3, 300, 60)
    rec = _record(sink, res["run_id"])
    assert (rec.model_calls, rec.input_tokens, rec.output_tokens) == (3, 300, 60)
    assert res["live"] == {"model_calls": 3, "tokens": 360}


def test_a_token_budget_stops_a_run_counted_from_spans(tmp_path: Path, guard_proxy: Any) -> None:
    sink, proxy = guard_proxy
    res = run_agent(tmp_path, proxy, instr="openinference", calls=10, max_tokens=250)
    out = res["outcome"]
    # 120 tokens a call, counted from the spans: the third step's implicit estimate (the mean,
    # 120 tokens) does not fit the 10 left of 250, so the run stops before its request
    assert (out["status"], out["reason"]) == ("terminated", "token_budget")
    assert (out["model_calls"], out["input_tokens"], out["output_tokens"]) == (2, 200, 40)
    assert res["llm_requests"] == 2
    rec = _record(sink, res["run_id"])
    assert (rec.reason.value, rec.input_tokens + rec.output_tokens) == ("token_budget", 240)


def test_a_third_party_tool_span_feeds_loop_detection_without_its_arguments(
    tmp_path: Path, guard_proxy: Any
) -> None:
    sink, proxy = guard_proxy
    res = run_agent(tmp_path, proxy, instr="openinference", calls=8, tool_loop=True)
    out = res["outcome"]
    # an OpenInference TOOL span per step, the same arguments and result: an exact repeat
    assert (out["status"], out["reason"]) == ("terminated", "loop_detected")
    assert out["tool_calls"] == 3
    assert res["stats"]["foreign_tool_calls"] == 3
    rec = _record(sink, res["run_id"])
    assert rec.last_action_hash == res["fingerprint"] and rec.last_tool == "get_weather"
    otlp = b"".join(proxy.bodies("TraceService/Export"))
    # the fingerprint went to the guard on the tool spans; the raw arguments never did
    assert otlp.count(res["fingerprint"].encode()) >= 3
    assert b"guard.action.fingerprint" in otlp and b"guard.result.hash" in otlp
    assert b"SECRET-TOOL-ARGS" not in proxy.all_bytes()
