"""Span and attribute names the SDK emits (CONTRACTS "Spans", DESIGN §3.3).

Current GenAI semantic-convention spellings are emitted; the guard also accepts the previous
ones on input. Raw text never goes on a span: only HMAC fingerprints, counters and names chosen
by the developer (agent, tool and model names).
"""

from __future__ import annotations

__all__ = [
    "ACTION_FP",
    "AGENT_NAME",
    "CACHE_READ",
    "COST_USD",
    "ERROR_TYPE",
    "INPUT_TOKENS",
    "OPERATION",
    "OUTPUT_TOKENS",
    "PARENT_RUN_ID",
    "PROGRESS",
    "PROVIDER",
    "REASONING_TOKENS",
    "REQUEST_MODEL",
    "RESPONSE_ID",
    "RESULT_HASH",
    "RUN_ID",
    "SEQ",
    "STATE_HASH",
    "STEP_INDEX",
    "STEP_SPAN",
    "STOP_REASON",
    "STOP_STATUS",
    "TENANT",
    "TOOL_ATTEMPTS",
    "TOOL_CALL_ID",
    "TOOL_NAME",
    "USAGE_STEPS",
    "USAGE_TOOL_CALLS",
]

OPERATION = "gen_ai.operation.name"
AGENT_NAME = "gen_ai.agent.name"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_ID = "gen_ai.response.id"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_READ = "gen_ai.usage.cache_read.input_tokens"
REASONING_TOKENS = "gen_ai.usage.reasoning.output_tokens"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
ERROR_TYPE = "error.type"

RUN_ID = "guard.run.id"
PARENT_RUN_ID = "guard.parent_run.id"
TENANT = "guard.tenant"
STEP_INDEX = "guard.step.index"
PROGRESS = "guard.progress"
STATE_HASH = "guard.state.hash"
ACTION_FP = "guard.action.fingerprint"
RESULT_HASH = "guard.result.hash"
TOOL_ATTEMPTS = "guard.tool.attempts"
COST_USD = "guard.cost.usd"
STOP_STATUS = "guard.stop.status"
STOP_REASON = "guard.stop.reason"
USAGE_STEPS = "guard.usage.steps"
USAGE_TOOL_CALLS = "guard.usage.tool_calls"
# The record number of a counted span (step, model call, tool call) within its run, set only
# when the run has a control stream: a restarted guard skips the spans its re-registration
# snapshot already counts (RunStarted.span_seq), and a span carrying it belongs to a run whose
# agent will re-register (the guard never writes a span-derived record for it).
SEQ = "guard.seq"

STEP_SPAN = "guard.step"
