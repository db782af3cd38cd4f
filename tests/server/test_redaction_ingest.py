"""The guard reads no content on ingest, and keeps none: not in an observation, an error
text or the decoder's cache (DESIGN §3.3). End to end (answers, logs, store):
tests/sdk/test_sdk_redaction_wire.py."""

from __future__ import annotations

from opentelemetry.proto.common.v1 import common_pb2

from guard.server.decode._decode import decode_payload, decode_spans

from .conftest import attr, request, span

SECRET = "SECRET-PROMPT-19be"
TRACE = b"\x01" * 16


def _content_spans() -> list:
    run = {"guard.run.id": "r-1", "guard.tenant": "acme"}
    model = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.usage.input_tokens": 40,
        "gen_ai.usage.output_tokens": 4,
        "gen_ai.input.messages": SECRET,  # short: would fit the decoder's memo
        "input.value": SECRET * 20,  # long: decoded each time
        "llm.input_messages.0.message.content": SECRET,
        "gen_ai.prompt.0.content": SECRET,
    }
    listed = span("chat gpt-4o", TRACE, {**run, **model})
    listed.attributes.append(  # a non-string value (the reference path)
        common_pb2.KeyValue(
            key="gen_ai.output.messages",
            value=common_pb2.AnyValue(
                array_value=common_pb2.ArrayValue(values=[common_pb2.AnyValue(string_value=SECRET)])
            ),
        )
    )
    refused = span("openai.chat", TRACE, {"input.value": SECRET})
    refused.attributes.append(attr("gen_ai.usage.input_tokens", -5))
    foreign = span("ChatCompletion", TRACE, {"llm.token_count.prompt": 7, "output.value": SECRET})
    return [span("guard.step", TRACE, run), listed, foreign, refused]


def test_no_content_in_observations_or_errors() -> None:
    # (the native decoder's string cache holds values of the keys it reads only, and no
    # content key is one: tests/test_semconv.py)
    spans = _content_spans()
    data = request(*spans).SerializeToString()
    for _ in range(3):  # repeats: what a cache would keep
        out = decode_payload(data)
    assert [o.kind for o in out.observations] == [2, 3, 3]  # step, our call, a foreign call
    assert out.rejected == 1 and "out of range" in out.errors[0]
    assert SECRET not in repr(out.observations) + repr(out.errors)
    # the reference decoder reads the same (nothing of the content either)
    ref = decode_spans(spans)
    assert [list(o) for o in ref.observations] == [list(o) for o in out.observations]
