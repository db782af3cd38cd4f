"""The content table (guard.semconv): content is recognised, counters and ids are not."""

from __future__ import annotations

import pytest

from guard.semconv import CONTENT_ATTRIBUTES, is_content_attribute, is_content_event
from guard.server.decode._schema import KEYS as _KEYS

CONTENT = [
    # current semconv
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.tool.definitions",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
    # previous semconv / OpenLLMetry
    "gen_ai.prompt",
    "gen_ai.prompt.0.content",
    "gen_ai.completion.3.tool_calls.0.arguments",
    "llm.prompts",
    "llm.prompts.0.prompt.text",
    "llm.request.functions.0.parameters",
    "traceloop.entity.input",
    "traceloop.entity.output",
    # OpenInference
    "input.value",
    "output.value",
    "llm.input_messages",
    "llm.input_messages.0.message.content",
    "llm.output_messages.1.message.tool_calls.0.tool_call.function.arguments",
    "llm.prompt_template.template",
    "llm.prompt_template.variables",
    "tool.parameters",
    "tool_call.function.arguments",
    "message.content",
    "message.contents.0.message_content.text",
    "retrieval.documents.2.document.content",
    "embedding.embeddings.0.embedding.text",
    # OpenLIT
    "gen_ai.content.prompt",
    "gen_ai.content.completion",
    "gen_ai.content.revised_prompt",
    "gen_ai.tool.args",
    # Pydantic AI / Logfire
    "all_messages_events",
    "pydantic_ai.all_messages",
    "final_result",
    "tool_arguments",
    "tool_response",
    # Google ADK
    "gcp.vertex.agent.llm_request",
    "gcp.vertex.agent.tool_call_args",
    # error text
    "exception.message",
    "exception.stacktrace",
]

NOT_CONTENT = [
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.system",
    "gen_ai.request.model",
    "gen_ai.response.model",
    "gen_ai.response.id",
    "gen_ai.response.finish_reasons",
    "gen_ai.tool.name",
    "gen_ai.tool.call.id",
    "gen_ai.agent.name",
    "gen_ai.conversation.id",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.details.cache_read_tokens",
    "gen_ai.usage.cost",
    "llm.usage.total_tokens",
    "llm.token_count.total",
    "llm.token_count.completion_details.reasoning",
    "llm.cost.total",
    "llm.model_name",
    "llm.prompt_template.version",
    "operation.cost",
    "openinference.span.kind",
    "input.mime_type",
    "tool.name",
    "embedding.model_name",
    "traceloop.entity.name",
    "traceloop.span.kind",
    "exception.type",
    "error.type",
    "session.id",
    "guard.run.id",
    "guard.cost.usd",
    "guard.action.fingerprint",
    "guard.pause.reason_fp",
]


@pytest.mark.parametrize("key", CONTENT)
def test_content_attributes(key: str) -> None:
    assert is_content_attribute(key)
    assert is_content_attribute(key)  # the cached verdict too


@pytest.mark.parametrize("key", NOT_CONTENT)
def test_counters_names_and_ids_are_kept(key: str) -> None:
    assert not is_content_attribute(key)


def test_no_attribute_the_guard_reads_is_content() -> None:
    """What the decoders keep is disjoint from what the SDK drops: redaction never hides a
    counter from the guard, and no content key can reach a slot of an observation."""
    assert [k for k in _KEYS if is_content_attribute(k)] == []


def test_every_source_lists_spellings_of_its_own() -> None:
    spellings = [s for v in CONTENT_ATTRIBUTES.values() for s in v]
    assert len(spellings) == len(set(spellings))
    assert all(s and s.count("*") <= 1 and (s.endswith("*") or "*" not in s) for s in spellings)


def test_content_events() -> None:
    for name in (
        "gen_ai.content.prompt",
        "gen_ai.content.completion",
        "gen_ai.system.message",
        "gen_ai.user.message",
        "gen_ai.assistant.message",
        "gen_ai.tool.message",
        "gen_ai.choice",
        "gen_ai.client.inference.operation.details",
    ):
        assert is_content_event(name)
    for name in ("exception", "guard.pause", "guard.evidence", "db.query.result"):
        assert not is_content_event(name)
