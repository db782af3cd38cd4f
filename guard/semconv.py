"""The GenAI attribute spellings otel-guard knows, by the instrumentation that emits them.

One table for the SDK and the guard, for the SDK's own spans and for those of third-party
instrumentations. It says which attributes carry a model call's *usage* and identity
(:data:`USAGE_ATTRIBUTES`, every spelling of every instrumentation, read by the guard's
decoders and by the SDK's span processor for third-party spans), which span operations are
model calls, aggregates or tool calls, where a third-party tool span keeps its arguments and
result (fingerprinted in-process, never exported), and which span attributes and span events
carry *content*: prompts, messages, system instructions, tool definitions, tool arguments and
results, retrieved documents, answers and error text. The SDK's export to the guard drops
them from every span, whoever wrote them (``guard.sdk._redact``); the guard's decoders read
none of them. Counters (token usage, cost), model and operation names, ids and our own
``guard.*`` attributes are not content.

Each source lists exact keys and key patterns; a pattern ending in ``*`` matches every key
that starts with what precedes the ``*`` (``"gen_ai.prompt.*"`` matches
``gen_ai.prompt.0.content``; ``"llm.input_messages*"`` also matches ``llm.input_messages``
itself). Pure data and string tests: no OpenTelemetry import, so the guard can use it too.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "AGGREGATE_OPERATIONS",
    "CONTENT_ATTRIBUTES",
    "CONTENT_EVENTS",
    "CONTENT_KEYS",
    "CONTENT_PREFIXES",
    "MODEL_OPERATIONS",
    "TOOL_ARGUMENTS",
    "TOOL_RESULTS",
    "TOOL_SPAN_KINDS",
    "USAGE_ATTRIBUTES",
    "USAGE_FIELDS",
    "USAGE_KEYS",
    "is_content_attribute",
    "is_content_event",
]

# -- usage and identity -----------------------------------------------------------------------
# field -> spellings, by emitter, the current semconv name first (who emits which: the table in
# shared/reference/scale-out-peers-semconv.md). A span normally carries one spelling per field;
# when it carries several (Pydantic AI writes gen_ai.usage.details.* next to the dotted names),
# they hold the same number, and the SDK reads the first one present. Input tokens include
# cached ones and output tokens the reasoning ones, in every spelling listed. Totals
# (gen_ai.usage.total_tokens, llm.token_count.total) are not read: input + output is the total.
USAGE_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "input_tokens": (
        "gen_ai.usage.input_tokens",  # semconv now; OpenLLMetry, OpenLIT, Pydantic AI, ADK
        "gen_ai.usage.prompt_tokens",  # previous semconv; older OpenLLMetry
        "llm.token_count.prompt",  # OpenInference
    ),
    "output_tokens": (
        "gen_ai.usage.output_tokens",
        "gen_ai.usage.completion_tokens",
        "llm.token_count.completion",
    ),
    "cache_read_tokens": (
        "gen_ai.usage.cache_read.input_tokens",  # semconv now (OpenLLMetry, OpenLIT too)
        "gen_ai.usage.cache_read_input_tokens",  # OpenLLMetry's older underscore form
        "llm.token_count.prompt_details.cache_read",  # OpenInference
        "gen_ai.usage.details.cache_read_tokens",  # Pydantic AI / Logfire
        "gen_ai.usage.prompt_tokens_details.cache_read",  # OpenLIT (TypeScript SDK)
    ),
    "cache_write_tokens": (  # validated, already inside input_tokens
        "gen_ai.usage.cache_write.input_tokens",  # semconv now (fragment 440)
        "gen_ai.usage.cache_creation.input_tokens",  # previous semconv; OpenLIT
        "gen_ai.usage.cache_creation_input_tokens",  # OpenLLMetry's older underscore form
        "llm.token_count.prompt_details.cache_write",  # OpenInference
        "gen_ai.usage.details.cache_write_tokens",  # Pydantic AI / Logfire
        "gen_ai.usage.prompt_tokens_details.cache_write",  # OpenLIT (TypeScript SDK)
    ),
    "reasoning_tokens": (
        "gen_ai.usage.reasoning.output_tokens",  # semconv now
        "gen_ai.usage.reasoning_tokens",  # OpenLLMetry's and OpenLIT's form
        "llm.token_count.completion_details.reasoning",  # OpenInference
        "gen_ai.usage.details.reasoning_tokens",  # Pydantic AI / Logfire
    ),
    "model": ("gen_ai.request.model", "llm.model_name"),  # OpenInference: llm.model_name
    "response_model": ("gen_ai.response.model",),
    "response_id": ("gen_ai.response.id",),  # OpenInference spans have none
    "operation": ("gen_ai.operation.name",),
    # OpenInference: tool.name; OpenLLMetry's @tool: traceloop.entity.name
    "tool_name": ("gen_ai.tool.name", "tool.name", "traceloop.entity.name"),
    "tool_call_id": ("gen_ai.tool.call.id", "tool_call.id"),
}
USAGE_FIELDS = tuple(USAGE_ATTRIBUTES)
# spelling -> field, every spelling of the table
USAGE_KEYS: dict[str, str] = {k: f for f, keys in USAGE_ATTRIBUTES.items() for k in keys}

# gen_ai.operation.name values (and span-name heads) of a model call
MODEL_OPERATIONS = frozenset(
    {"chat", "text_completion", "generate_content", "embeddings", "completion", "responses"}
)
# Operations of spans that aggregate their children (agents, workflows, runner entrypoints,
# tools): their usage, when they carry any, is the sum of calls counted on their own spans.
AGGREGATE_OPERATIONS = frozenset(
    {
        "invoke_agent",
        "create_agent",
        "execute_tool",
        "invoke_workflow",
        "handle_conversation_turn",  # runner entrypoints (semconv fragment 571)
    }
)
# A span's kind in an instrumentation's own attribute -> the value that makes it a tool call
# (OpenInference: LLM, TOOL, AGENT, CHAIN, ...; OpenLLMetry: workflow, task, agent, tool)
TOOL_SPAN_KINDS: dict[str, str] = {"openinference.span.kind": "TOOL", "traceloop.span.kind": "tool"}
# Where a third-party tool span keeps the call's arguments and its result (all of them content,
# dropped on the way to the guard): the SDK fingerprints the first one present in-process.
TOOL_ARGUMENTS = (
    "gen_ai.tool.call.arguments",  # semconv now
    "input.value",  # OpenInference TOOL spans
    "tool_arguments",  # Pydantic AI
    "gen_ai.tool.args",  # OpenLIT
    "gcp.vertex.agent.tool_call_args",  # Google ADK
    "traceloop.entity.input",  # OpenLLMetry's @tool
)
TOOL_RESULTS = (
    "gen_ai.tool.call.result",
    "output.value",
    "tool_response",
    "gcp.vertex.agent.tool_response",
    "traceloop.entity.output",
)

# source -> spellings of content attributes (exact keys, or prefixes ending in "*")
CONTENT_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    # OpenTelemetry GenAI semconv, current (semantic-conventions-genai); opt-in content
    "semconv": (
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.system_instructions",
        "gen_ai.tool.definitions",  # names, descriptions and schemas of the offered tools
        "gen_ai.tool.description",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
        "gen_ai.agent.description",
        "gen_ai.retrieval.query.text",
        "gen_ai.retrieval.documents",
    ),
    # previous semconv spellings, also OpenLLMetry's indexed form (gen_ai.prompt.0.content)
    "semconv-previous": (
        "gen_ai.prompt",
        "gen_ai.prompt.*",
        "gen_ai.completion",
        "gen_ai.completion.*",
    ),
    # OpenLLMetry / Traceloop (opentelemetry-semantic-conventions-ai)
    "openllmetry": (
        "llm.prompts*",
        "llm.completions*",
        "llm.request.functions*",  # tool definitions with descriptions and parameters
        "llm.content.completion.chunk",
        "traceloop.entity.input",
        "traceloop.entity.output",
        "traceloop.prompt.template",
        "traceloop.prompt.template_variables",
        "mcp.request.argument",
        "mcp.response.value",
        "db.query.result.document",
        "db.query.result.metadata",
        "db.search.result.entity",
        "db.marqo.search.query",
    ),
    # OpenInference (Arize; spec/semantic_conventions.md)
    "openinference": (
        "input.value",
        "output.value",
        "input.audio*",
        "output.audio*",
        "llm.input_messages*",
        "llm.output_messages*",
        "llm.choices*",
        "llm.function_call",
        "llm.tools*",
        "llm.invocation_parameters",  # the request minus the messages: may hold tools, system
        "llm.prompt_template.template",
        "llm.prompt_template.variables",
        "message.content*",  # message.content, message.contents.N.message_content.*
        "message.function_call_arguments_json",
        "message.tool_calls*",
        "message_content.*",
        "tool.parameters",
        "tool.description",
        "tool.json_schema",
        "tool_call.function.arguments",
        "retrieval.documents*",
        "reranker.input_documents*",
        "reranker.output_documents*",
        "reranker.query",
        "document.content",
        "document.metadata",
        "embedding.embeddings*",  # texts and the vectors made from them
        "embedding.text",
        "embedding.invocation_parameters",
        "image.url",  # often a base64 data URI of the image itself
        "audio.url",
        "audio.transcript",
        "annotation.explanation",
        "evaluation.explanation",
        "metadata",
    ),
    # OpenLIT (sdk/python/src/openlit/semcov): content attributes on spans and on its
    # gen_ai.content.* events; its guard/eval explanations quote the content they judge
    "openlit": (
        "gen_ai.content.*",
        "gen_ai.tool.args",
        "gen_ai.response.tool_calls",
        "gen_ai.agent.context",
        "gen_ai.agent.task",
        "gen_ai.agent.instructions",
        "gen_ai.agent.goal",
        "gen_ai.agent.human_input",
        "gen_ai.agent.expected_output",
        "gen_ai.agent.actual_output",
        "gen_ai.agent.tool_results",
        "guard.explanation",
        "evals.explanation",
        "db.query.text",  # the vector-store query text (SQL text elsewhere)
        "db.statement",
        "db.where_document",
    ),
    # Pydantic AI (instrumentation versions 1-2 and 3+) and Logfire
    "pydantic-ai": (
        "all_messages_events",
        "pydantic_ai.all_messages",
        "final_result",
        "events",  # event_mode="attributes": the message events as one JSON attribute
        "tool_arguments",
        "tool_response",
        "model_request_parameters",  # tool definitions and output schema
        "pydantic_ai.tool.deferral.metadata",
        "logfire.msg",  # a formatted message may interpolate arguments
    ),
    # Google ADK's own tracing (google.adk.telemetry): request/response JSON on its spans
    "google-adk": (
        "gcp.vertex.agent.llm_request",
        "gcp.vertex.agent.llm_response",
        "gcp.vertex.agent.tool_call_args",
        "gcp.vertex.agent.tool_response",
    ),
    # error text (OpenTelemetry exception events): may quote arguments or results
    "exception": (
        "exception.message",
        "exception.stacktrace",
    ),
}

# Events dropped whole (exact names, or prefixes ending in "*"): every GenAI semconv event
# (gen_ai.user.message, gen_ai.choice, gen_ai.client.inference.operation.details, ...), and
# OpenLIT's gen_ai.content.prompt / gen_ai.content.completion, are about content.
CONTENT_EVENTS: tuple[str, ...] = ("gen_ai.*",)


def _split(spellings: Iterable[str]) -> tuple[frozenset[str], tuple[str, ...]]:
    exact, prefixes = set(), []
    for s in spellings:
        if s.endswith("*"):
            prefixes.append(s[:-1])
        else:
            exact.add(s)
    return frozenset(exact), tuple(sorted(set(prefixes)))


CONTENT_KEYS, CONTENT_PREFIXES = _split(s for v in CONTENT_ATTRIBUTES.values() for s in v)
_EVENT_NAMES, _EVENT_PREFIXES = _split(CONTENT_EVENTS)

# key -> verdict. Attribute keys repeat from span to span (a handful per instrumentation);
# indexed ones (llm.input_messages.7.message.content) do not, so the cache is bounded and
# simply cleared when full.
_VERDICTS: dict[str, bool] = {}
_VERDICTS_MAX = 4096


def is_content_attribute(key: str) -> bool:
    """True when an attribute with this key carries content (see the module docstring)."""
    verdict = _VERDICTS.get(key)
    if verdict is None:
        verdict = key in CONTENT_KEYS or key.startswith(CONTENT_PREFIXES)
        if len(_VERDICTS) >= _VERDICTS_MAX:
            _VERDICTS.clear()
        _VERDICTS[key] = verdict
    return verdict


def is_content_event(name: str) -> bool:
    """True when an event with this name is content as a whole (dropped, not filtered)."""
    return name in _EVENT_NAMES or name.startswith(_EVENT_PREFIXES)


# ===================================== emitted by the SDK =====================================
# The span, attribute and event names the SDK writes on its own spans: the current GenAI
# semconv spellings (the guard also accepts the previous ones, USAGE_ATTRIBUTES above) and
# our own guard.* names. Raw text never goes on a span: only HMAC fingerprints, counters and
# names chosen by the developer (agent, tool and model names).
# Not in __all__ (a separate vocabulary): ``from guard import semconv as A; A.RUN_ID``.
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
# True on the span of a declared poll's call (which carries no guard.action.fingerprint: the
# guard counts it, and the SDK's poll rule judges it).
TOOL_POLL = "guard.tool.poll"
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
# Operation names (gen_ai.operation.name) of the run and tool spans, also the head of their span
# names ("invoke_agent {agent}", "execute_tool {tool}"); model calls use MODEL_OPERATIONS.
INVOKE_AGENT = "invoke_agent"
EXECUTE_TOOL = "execute_tool"

# Events on the run span: a pause / resume, evidence, and each directive ("guard.warn",
# "guard.wrap_up": DIRECTIVE_EVENT_PREFIX + the action) with its reason and who decided it.
PAUSE_EVENT = "guard.pause"
PAUSE_REASON_FP = "guard.pause.reason_fp"
RESUME_EVENT = "guard.resume"
EVIDENCE_EVENT = "guard.evidence"
EVIDENCE_NAME = "guard.evidence.name"
EVIDENCE_OK = "ok"
DIRECTIVE_EVENT_PREFIX = "guard."
DIRECTIVE_REASON = "guard.reason"
DIRECTIVE_DECIDED_BY = "guard.decided_by"
