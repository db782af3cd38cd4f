"""An agent process for the third-party-span tests: ``python _foreign_agent.py CONFIG_JSON``.

A real instrumentation (OpenLLMetry, OpenInference or OpenLIT) on the real ``openai`` client,
calling the test's local OpenAI-compatible server inside a ``@guard.run``, with no
TracerProvider of the application's own (OpenLIT sets one, as it does). A process of its own:
instrumentors patch ``openai`` and OpenTelemetry's global provider can be set only once.

CONFIG: ``instr``; ``order`` (``"instrument_first"`` or ``"configure_first"``); ``endpoint``;
``tenant``; ``llm`` (base URL); ``calls`` (model calls, one per step); ``explicit`` (also
``step.model_call`` with the response's usage); ``max_tokens``; ``tool_loop`` (an OpenInference
TOOL span per step, same arguments and result); ``app_provider`` (the application sets an SDK
TracerProvider globally first); ``admin`` (the guard's address: before the run returns, the
guard's live view of it, ``live``, once its spans are in); ``out`` (the JSON result file).
"""

from __future__ import annotations

import json
import sys
from typing import Any

cfg = json.loads(sys.argv[1])

import guard  # noqa: E402 - after reading the config, as an application would
from guard.sdk._run import current_run_or_none  # noqa: E402


def instrument() -> None:
    name = cfg["instr"]
    if name == "openllmetry":
        from opentelemetry.instrumentation.openai import OpenAIInstrumentor

        OpenAIInstrumentor().instrument()
    elif name == "openinference":
        from openinference.instrumentation.openai import OpenAIInstrumentor

        OpenAIInstrumentor().instrument()
    elif name == "openlit":
        import openlit

        openlit.init(disable_metrics=True, disable_events=True, disable_batch=True)
    else:  # pragma: no cover
        raise SystemExit(f"unknown instrumentation {name!r}")


def configure() -> None:
    guard.configure(endpoint=cfg["endpoint"], tenant=cfg["tenant"])


if cfg.get("app_provider"):
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    trace.set_tracer_provider(TracerProvider())

if cfg["order"] == "instrument_first":
    instrument()
    configure()
else:
    configure()
    instrument()

import openai  # noqa: E402

client = openai.OpenAI(base_url=cfg["llm"], api_key="test-key", max_retries=0)
SECRET_ARGS = "SECRET-TOOL-ARGS-9d1c"


def tool_tracer() -> Any:
    from openinference.instrumentation import OITracer, TraceConfig
    from opentelemetry import trace

    return OITracer(trace.get_tracer("weather-tools"), config=TraceConfig())


if cfg.get("tool_loop"):
    _tracer = tool_tracer()

    @_tracer.tool
    def get_weather(city: str) -> str:
        return "sunny"


result: dict[str, Any] = {}


@guard.run(agent="foreign-bot", max_tokens=cfg.get("max_tokens"))
def agent() -> str:
    run = result["run"] = current_run_or_none()
    result["run_id"] = run.run_id
    if cfg.get("tool_loop"):
        result["fingerprint"] = run.fp.action("get_weather", {"city": SECRET_ARGS})
    for _ in range(cfg["calls"]):
        with guard.step() as step:
            r = client.chat.completions.create(
                model="gpt-4.1", messages=[{"role": "user", "content": "weather?"}]
            )
            if cfg.get("explicit"):  # the README quickstart's way, next to an instrumentation
                step.model_call(
                    model="gpt-4.1",
                    input_tokens=r.usage.prompt_tokens,
                    output_tokens=r.usage.completion_tokens,
                )
            if cfg.get("tool_loop"):
                get_weather(SECRET_ARGS)
            step.progress(True)
    if cfg.get("admin"):
        from pathlib import Path

        sys.path.append(str(Path(__file__).resolve().parents[1]))  # tests/: _wait
        from _live_view import live_view  # this script's folder is on sys.path

        result["live"] = live_view(cfg["admin"], run.run_id, cfg["calls"])
    return "done"


try:
    agent()
    outcome = result.pop("run").outcome  # the record of a completed run
except guard.RunStopped as stop:
    result.pop("run")
    outcome = stop.outcome
stats = guard.stats()
guard.shutdown()
fields = ("status", "reason", "input_tokens", "output_tokens", "cached_tokens")
fields += ("reasoning_tokens", "model_calls", "tool_calls", "steps")
result["outcome"] = {f: getattr(outcome, f) for f in fields}
result["outcome"]["status"] = str(outcome.status.value)
result["outcome"]["reason"] = str(outcome.reason.value)
result["stats"] = stats
with open(cfg["out"], "w") as f:
    json.dump(result, f)
