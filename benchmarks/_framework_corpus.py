"""The loop corpus through real agent frameworks (``loop_corpus.py --frameworks ...``).

Each trace of ``tests/policy/policy_corpus*.py`` is replayed as one ``@guard.run`` around a
real framework run, with ``guard.instrument()`` and nothing else: no ``guard.step``, no facts
and no progress flags, so the detector sees only what an integration infers (a step per model
turn, each tool call's arguments and result). The model is the scripted OpenAI-compatible
server of the integration tests (``tests/integrations/_llm_server.py``): its reply ``i`` asks
for the tool calls of the trace's step ``i`` (several calls: one turn of parallel tool calls),
then it answers ``done``. Each tool name of the trace is one real function tool of the
framework, returning the trace's recorded result for that call (looked up by the step, the
name and the arguments). The SDK detects in-process (``guard.configure()`` without an
endpoint: no guard server).

The framework's stop step is the trace step in progress when ``RunStopped`` came out: the last
model reply served (a model call refused by the stop never reaches the server). ``len(steps)``
is the final answer's turn. It is compared with the pure detector (``run_trace``, the same
settings) on the trace without its facts and progress flags (what the framework run gives the
detector) and with them (the corpus' own figures).

A second pass (``with_agent_facts``) replays the traces that carry facts or progress flags
with the agent reporting them from its tools, one ``guard.progress(...)`` line, as an agent
that knows its task state would.

Traces tagged ``polling`` declare their poll tool when the SDK has a way to: feature-detected,
``guard.instrument(polls=[...])``, else ``@guard.tool(poll=True)`` inside the tool; else
undeclared (``declared_with`` says which applied).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import importlib.metadata
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai

import guard
from guard.policy import LoopSettings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "policy"))  # the corpus
# the scripted model server (it imports its Anthropic renderers from there too)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integrations"))

from _indistinguishable import canon, poll_tools
from _llm_server import LLMServer, Reply, text
from policy_corpus import CORPUS, Trace, TraceResult, run_trace

__all__ = ["FRAMEWORKS", "QUICK", "run"]

# A smoke subset: one loop per detector pattern (a parallel-call step among them), easy and
# hard legitimate traces, the polling one.
QUICK = (
    "exact_repeat_search",
    "cycle_of_3",
    "varied_args_same_empty_result",
    "stagnation_varied_actions",
    "reread_thrice_in_one_step",
    "read_edit_read",
    "reread_policy_per_customer",
    "faq_single_lookup",
    "batch_rename_ack_results",
    "long_job_polling",
)
_SCHEMA = {"type": "object", "properties": {}, "additionalProperties": True}
_TRACE_TIMEOUT_S = 120.0  # a wedged framework run is an error of that trace, not a hung run


def _tool_steps(trace: Trace) -> tuple | None:
    """The steps the model's turns replay: trailing steps without calls are the final answer;
    a step without calls before that (a model turn that asks for no tool and does not answer)
    cannot be expressed, since a framework ends its run at the first answer without tools."""
    steps = list(trace.steps)
    while steps and not steps[-1].calls:
        steps.pop()
    if not steps or any(not s.calls for s in steps):
        return None
    return tuple(steps)


class Scripted:
    """One trace's model (the server's script) and tool results."""

    def __init__(self, trace: Trace, steps: tuple, report: bool = False) -> None:
        self.trace, self.steps = trace, steps
        self.report = report  # the tools report the step's facts (guard.progress)
        self.served = 0  # model replies handed out
        self.tool_runs = 0
        self.lookup_errors: list[str] = []
        # (step, tool) -> [canonical arguments, result] of its calls not answered yet
        self._left: dict[tuple, list] = collections.defaultdict(list)
        for i, s in enumerate(steps):
            for c in s.calls:
                self._left[(i, c.tool)].append((canon(c.args), c.result))

    def reply(self, body: dict, api: str) -> Reply:
        i, self.served = self.served, self.served + 1
        if i < len(self.steps):
            calls = tuple(
                (c.tool, c.args, f"call_{i}_{j}") for j, c in enumerate(self.steps[i].calls)
            )
            return Reply(tool_calls=calls)
        return text("done")

    def result(self, name: str, args: Any) -> Any:
        """The recorded result of this call of the step in progress (its tools run between
        its reply and the next request): by arguments, else the step's next call of that
        tool (the framework may have reshaped the arguments)."""
        self.tool_runs += 1
        step, key = self.served - 1, canon(args)
        left = self._left.get((step, name))
        if not left:
            self.lookup_errors.append(f"step {step}: {name}({key})")
            return "error: no such call in the trace"
        at = next((i for i, (k, _) in enumerate(left) if k == key), 0)
        st = self.steps[step]
        if self.report and (st.facts is not None or st.progress is not None):
            guard.progress(st.progress, facts=st.facts)  # the agent's own word on its task
        return left.pop(at)[1]


@dataclasses.dataclass
class Replayed:
    """One trace's framework run (the fields the figures read are TraceResult's)."""

    stopped: bool
    stop_step: int | None = None
    reason: str | None = None
    pattern: str | None = None
    tool_calls: int = 0
    model_calls: int = 0
    error: str | None = None


# The detector's two ways to stop a run: a loop, and stagnation (no progress for N steps).
_DETECTOR_REASONS = ("loop_detected", "no_progress")


def _pattern(reason: str, message: str) -> str:
    # "loop_detected: exact_repeat: same call ..." -> "exact_repeat"; a stagnation stop
    # ("no_progress: state unchanged for 8 steps ...") has no pattern but its reason
    parts = [p.strip() for p in message.split(":")]
    return parts[1] if reason == "loop_detected" and len(parts) > 2 else reason


def _poll_wrap(name: str, fn: Callable[..., Any], how: str | None) -> Callable[..., Any]:
    return guard.tool(name=name, poll=True)(fn) if how == "guard.tool(poll=True)" else fn


# -- the frameworks ----------------------------------------------------------------------------
async def _agents(sc: Scripted, client: Any, polls: tuple, how: str | None) -> Any:
    from agents import Agent, FunctionTool, OpenAIChatCompletionsModel, Runner

    def invoke(name: str) -> Callable[..., Any]:
        async def tool(**args: Any) -> Any:
            return sc.result(name, args)

        body = _poll_wrap(name, tool, how if name in polls else None)

        async def on_invoke(ctx: Any, arguments: str) -> Any:
            return await body(**json.loads(arguments or "{}"))

        return on_invoke

    names = sorted({c.tool for s in sc.steps for c in s.calls})
    tools = [
        FunctionTool(
            name=n,
            description=f"the {n} tool",
            params_json_schema=_SCHEMA,
            on_invoke_tool=invoke(n),
            strict_json_schema=False,  # the corpus' arguments are free-form objects
        )
        for n in names
    ]
    agent = Agent(
        name=sc.trace.name,
        instructions="Do the task.",
        tools=tools,
        model=OpenAIChatCompletionsModel(model="gpt-4.1", openai_client=client),
    )
    result = await Runner.run(agent, "Do the task.", max_turns=len(sc.steps) + 5)
    return result.final_output


async def _pydantic_ai(sc: Scripted, client: Any, polls: tuple, how: str | None) -> Any:
    from pydantic_ai import Agent, Tool
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import UsageLimits

    def tool_of(name: str) -> Tool:
        async def tool(**args: Any) -> Any:
            return sc.result(name, args)

        fn = _poll_wrap(name, tool, how if name in polls else None)
        return Tool.from_schema(fn, name=name, description=f"the {name} tool", json_schema=_SCHEMA)

    names = sorted({c.tool for s in sc.steps for c in s.calls})
    model = OpenAIChatModel("gpt-4.1", provider=OpenAIProvider(openai_client=client))
    agent = Agent(model, name=sc.trace.name, tools=[tool_of(n) for n in names])
    limits = UsageLimits(request_limit=len(sc.steps) + 5)
    return (await agent.run("Do the task.", usage_limits=limits)).output


FRAMEWORKS: dict[str, tuple[str, Callable[..., Any]]] = {
    "agents": ("openai-agents", _agents),
    "pydantic_ai": ("pydantic-ai-slim", _pydantic_ai),
}


_on: dict[str, Any] = {}  # "polls": the poll tools the integrations were turned on with, "how"


def _instrument(polls: tuple) -> str | None:
    """Turn the integrations on, again only when the poll tools to declare change (a
    declaration is per ``instrument()``); declare them when the SDK can. Returns how."""
    if _on.get("polls") != polls:
        _on.update(polls=polls, how=_turn_on(polls))
    return _on["how"]


def _turn_on(polls: tuple) -> str | None:
    guard.uninstrument()
    if polls:
        try:
            guard.instrument(polls=list(polls))  # type: ignore[call-arg]
            return "instrument(polls=...)"
        except TypeError:
            pass
        guard.instrument()
        try:
            guard.tool(name="probe", poll=True)  # type: ignore[call-overload]
            return "guard.tool(poll=True)"
        except TypeError:
            return None
    guard.instrument()
    return None


def _run_one(
    fw: Callable[..., Any], trace: Trace, llm: LLMServer, settings: LoopSettings, report=False
) -> tuple[Replayed, dict]:
    steps = _tool_steps(trace)
    assert steps is not None
    sc = Scripted(trace, steps, report)
    llm.script = sc.reply
    polls = poll_tools(trace)
    how = _instrument(polls)

    @guard.run(agent=trace.name, loop=settings)
    async def replay() -> Any:
        # closed in this event loop (asyncio.run closes it after the run)
        async with openai.AsyncOpenAI(base_url=llm.base_url, api_key="test", max_retries=0) as c:
            return await asyncio.wait_for(fw(sc, c, polls, how), _TRACE_TIMEOUT_S)

    try:
        final = asyncio.run(replay())
        out = Replayed(False, error=None if final == "done" else f"final output {final!r}")
    except guard.RunStopped as stop:
        o = stop.outcome
        reason = str(getattr(o.reason, "value", o.reason))
        # a stop for anything else (a budget, a cancel) is not the detector's: an error
        detected = reason in _DETECTOR_REASONS
        out = Replayed(detected, sc.served - 1, reason, _pattern(reason, o.message))
        out.error = None if detected else f"stopped for {reason}: {o.message}"
    except Exception as exc:  # the framework failed: reported, the corpus goes on
        out = Replayed(False, error=f"{type(exc).__name__}: {exc}"[:300])
    out.tool_calls, out.model_calls = sc.tool_runs, sc.served
    if sc.lookup_errors:
        out.error = f"calls not in the trace: {sc.lookup_errors[:3]}"
    return out, {"tools": list(polls), "declared_with": how} if polls else {}


def _has_facts(trace: Trace) -> bool:
    return any(s.facts is not None or s.progress is not None for s in trace.steps)


def _bare(trace: Trace) -> Trace:
    """The trace as an integration sees it: no facts, no progress flags."""
    steps = tuple(dataclasses.replace(s, facts=None, progress=None) for s in trace.steps)
    return dataclasses.replace(trace, steps=steps)


def _versus(outs: dict, pure: dict[str, TraceResult], traces: list[Trace]) -> dict:
    """Framework stop steps against the pure detector's on the same traces."""
    same, later, earlier, only_fw, only_pure = [], {}, {}, [], []
    for t in traces:
        o, p = outs[t.name], pure[t.name]
        if o.stopped and p.stopped:
            d = o.stop_step - p.stop_step
            if d == 0:
                same.append(t.name)
            else:
                (later if d > 0 else earlier)[t.name] = d
        elif o.stopped:
            only_fw.append(t.name)
        elif p.stopped:
            only_pure.append(t.name)
    return {
        "same_step": len(same),
        "later": later,
        "earlier": earlier,
        "stopped_only_by_framework": only_fw,
        "stopped_only_by_pure": only_pure,
    }


def _figures(traces: list[Trace], res: dict) -> dict:
    """Recall, false positives and delay; ``res``: TraceResult or Replayed by trace name."""
    loops = [t for t in traces if t.label == "loop"]
    legit = [t for t in traces if t.label == "legit"]
    easy = [t for t in legit if not t.hard]
    caught = [t for t in loops if res[t.name].stopped]
    early = [t.name for t in caught if res[t.name].stop_step < t.loop_start]
    delays = [res[t.name].stop_step - t.loop_start for t in caught if t.name not in early]
    fp = [t for t in legit if res[t.name].stopped]
    return {
        "loop_traces": len(loops),
        "legit_traces": len(legit),
        "hard_legit_traces": len(legit) - len(easy),
        "recall": round(len(caught) / len(loops), 4) if loops else None,
        "loops_stopped": f"{len(caught)}/{len(loops)}",
        "false_positive_rate": round(len(fp) / len(legit), 4) if legit else None,
        "false_positive_rate_easy": round(sum(not t.hard for t in fp) / len(easy), 4)
        if easy
        else None,
        "delay_steps": {
            "mean": round(statistics.fmean(delays), 2) if delays else None,
            "max": max(delays) if delays else None,
        },
        "early_stops": early,
        "missed_loops": [t.name for t in loops if not res[t.name].stopped],
        "false_positives": {t.name: _said(res[t.name]) for t in fp},
    }


def run(names: list[str], settings: LoopSettings, quick: bool = False) -> dict:
    """Every expressible trace through each named framework; the JSON-able report."""
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # it would export to OpenAI
    chosen = [t for t in CORPUS if not quick or t.name in QUICK]
    traces = [t for t in chosen if _tool_steps(t) is not None]
    skipped = [t.name for t in chosen if _tool_steps(t) is None]
    pure = {t.name: run_trace(t, settings) for t in traces}
    bare = {t.name: run_trace(_bare(t), settings) for t in traces}
    guard.configure(hmac_key=b"corpus-key")  # local only: the SDK's own detector decides
    report: dict[str, Any] = {
        "traces_run": len(traces),
        "not_expressible": {
            n: "a model turn without tool calls before the answer" for n in skipped
        },
        "pure_without_facts": _figures(traces, bare),
        "pure_with_facts": _figures(traces, pure),
        "frameworks": {},
    }
    with LLMServer() as llm:
        for name in names:
            package, fw = FRAMEWORKS[name]
            started = time.perf_counter()
            outs: dict[str, Replayed] = {}
            polls: dict[str, dict] = {}
            for t in traces:
                outs[t.name], declared = _run_one(fw, t, llm, settings)
                if declared:
                    polls[t.name] = declared
            # The agent's facts and progress flags, reported from its tools with one
            # guard.progress() line (the traces that carry any; the others as they ran).
            told = {
                t.name: _run_one(fw, t, llm, settings, True)[0] if _has_facts(t) else outs[t.name]
                for t in traces
            }
            wall = time.perf_counter() - started
            fig = _figures(traces, outs)
            with_facts = _figures(traces, told)
            with_facts["vs_pure_with_facts"] = _versus(told, pure, traces)
            # a miss: what the pure detector makes of the same trace
            fig["missed_loops"] = {
                n: {"pure_without_facts": _said(bare[n]), "pure_with_facts": _said(pure[n])}
                for n in fig["missed_loops"]
            }
            stopped = [o for o in outs.values() if o.stopped]
            report["frameworks"][name] = {
                "library": f"{package} {importlib.metadata.version(package)}",
                **fig,
                "vs_pure_without_facts": _versus(outs, bare, traces),
                "vs_pure_with_facts": _versus(outs, pure, traces),
                "patterns": dict(collections.Counter(o.pattern for o in stopped)),
                "polls": polls,
                "with_agent_facts": with_facts,
                "errors": {n: o.error for n, o in (*outs.items(), *told.items()) if o.error},
                # [framework, pure without facts, pure with facts] where any stopped
                "stop_steps": {
                    n: [outs[n].stop_step, bare[n].stop_step, pure[n].stop_step]
                    for n in (t.name for t in traces)
                    if outs[n].stopped or bare[n].stopped or pure[n].stopped
                },
                "model_calls": sum(o.model_calls for o in outs.values()),
                "tool_calls": sum(o.tool_calls for o in outs.values()),
                "wall_s": round(wall, 1),
            }
    guard.uninstrument()
    _on.clear()
    guard.shutdown()
    return report


def _said(r: Any) -> str:
    return f"{r.pattern} at step {r.stop_step}" if r.stopped else "not stopped"
