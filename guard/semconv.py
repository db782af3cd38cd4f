"""The GenAI attribute spellings otel-guard knows, by the instrumentation that emits them.

One table for the SDK and the guard (DESIGN §3.3, §3.7). Today it says which span attributes
and span events carry *content*: prompts, messages, system instructions, tool definitions,
tool arguments and results, retrieved documents, answers and error text. The SDK's export to
the guard drops them from every span, whoever wrote them (``guard.sdk._redact``); the guard's
decoders read none of them. Counters (token usage, cost), model and operation names, ids
and our own ``guard.*`` attributes are not content.

Each source lists exact keys and key patterns; a pattern ending in ``*`` matches every key
that starts with what precedes the ``*`` (``"gen_ai.prompt.*"`` matches
``gen_ai.prompt.0.content``; ``"llm.input_messages*"`` also matches ``llm.input_messages``
itself). Pure data and string tests: no OpenTelemetry import, so the guard can use it too.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "CONTENT_ATTRIBUTES",
    "CONTENT_EVENTS",
    "CONTENT_KEYS",
    "CONTENT_PREFIXES",
    "is_content_attribute",
    "is_content_event",
]

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
