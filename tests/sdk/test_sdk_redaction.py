"""Nothing raw leaves the process: canaries in arguments, results, facts and errors."""

from __future__ import annotations

import asyncio

import pytest

import guard
from guard.sdk._api import reset
from guard.testing import SpanSink, capture_spans

CANARIES = [
    "CANARY-ARG-7f3a",
    "杭州天气-CANARY",
    "CANARY-RESULT-91c2",
    "CANARY-FACT-55d0",
    "CANARY-ERR-0b1e",
    "CANARY-KW-e2e2",
    "CANARY-PAUSE-aa11",
]


async def test_canaries_never_reach_any_span(sink: SpanSink) -> None:
    @guard.tool
    async def lookup(city: str, *, note: str = "") -> dict:
        return {"weather": "CANARY-RESULT-91c2", "city": city}

    @guard.tool
    def broken(token: str) -> None:
        raise ValueError("CANARY-ERR-0b1e " + token)

    @guard.run(agent="bot", max_steps=5)
    async def f() -> None:
        run = guard.current_run()
        async with guard.step() as step:
            step.model_call(model="gpt-4.1", input_tokens=10, output_tokens=2, response_id="resp-1")
            await lookup("杭州天气-CANARY", note="CANARY-KW-e2e2")
            step.tool_call("search", {"q": "CANARY-ARG-7f3a"}, result="CANARY-RESULT-91c2")
            step.progress(facts=["CANARY-FACT-55d0"])
            run.pause("CANARY-PAUSE-aa11")
            run.resume()
        async with guard.step():
            await asyncio.sleep(0)
            broken("CANARY-ARG-7f3a")

    with pytest.raises(ValueError):
        await f()
    dump = sink.dump()
    assert "execute_tool lookup" in dump and "guard.result.hash" in dump
    for canary in CANARIES:
        assert canary not in dump
        assert canary.encode("unicode_escape").decode() not in dump  # nor escaped


def test_fingerprints_ignore_key_order_but_change_with_the_hmac_key() -> None:
    def fingerprints(key: bytes, args: dict) -> str:
        with capture_spans(hmac_key=key) as s:

            @guard.run(agent="a")
            def f() -> None:
                with guard.step() as step:
                    step.tool_call("search", args, result={"n": 1, "m": 2})

            f()
            attrs = s.attributes("execute_tool")[0]
        reset()
        return attrs["guard.action.fingerprint"] + attrs["guard.result.hash"]

    a = fingerprints(b"deployment-key-A", {"q": "refund", "lang": "en", "page": 1})
    b = fingerprints(b"deployment-key-A", {"lang": "en", "q": "refund", "page": 2})
    c = fingerprints(b"deployment-key-B", {"q": "refund", "lang": "en", "page": 1})
    d = fingerprints(b"deployment-key-A", {"q": "refund!", "lang": "de"})
    assert a == b  # key order and the ignored pagination field do not matter
    assert a != c  # another deployment key: unrelated hashes
    assert a[:32] != d[:32]


def test_redact_span_copies_without_content_and_leaves_the_original(sink: SpanSink) -> None:
    from guard.sdk._redact import Redaction, redact_span

    tracer = sink.provider.get_tracer("openinference")
    with (
        pytest.raises(ValueError),
        tracer.start_as_current_span(
            "ChatCompletion",
            attributes={
                "llm.token_count.prompt": 12,
                "llm.model_name": "gpt-4.1",
                "input.value": "CANARY-ARG-7f3a",
                "llm.output_messages.0.message.content": "CANARY-RESULT-91c2",
            },
        ) as s,
    ):
        s.add_event("gen_ai.choice", {"message": "CANARY-RESULT-91c2"})
        s.add_event("retry", {"attempt": 2, "tool_call.function.arguments": "CANARY-ARG-7f3a"})
        raise ValueError("CANARY-ERR-0b1e")
    (span,) = sink.spans
    before = span.to_json()
    counts = Redaction()
    out = redact_span(span, counts)
    assert span.to_json() == before  # the application's span is untouched
    assert "CANARY" in before and "CANARY" not in out.to_json()
    assert dict(out.attributes) == {"llm.token_count.prompt": 12, "llm.model_name": "gpt-4.1"}
    assert [(e.name, dict(e.attributes)) for e in out.events] == [
        ("retry", {"attempt": 2}),
        ("exception", {"exception.type": "ValueError", "exception.escaped": "False"}),
    ]
    assert out.status.status_code == span.status.status_code and out.status.description is None
    assert (out.context, out.parent, out.name, out.end_time) == (
        span.context,
        span.parent,
        span.name,
        span.end_time,
    )
    # 2 span attributes, 1 retry attribute, exception message + stack trace, status text
    assert (counts.attributes, counts.events) == (6, 1)


def test_our_own_spans_pass_through_uncopied(sink: SpanSink) -> None:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from guard.sdk._redact import RedactingSpanExporter

    @guard.tool
    def lookup(city: str) -> str:
        return "CANARY-RESULT-91c2"

    @guard.run(agent="bot")
    def f() -> None:
        guard.current_run().pause("CANARY-PAUSE-aa11")
        guard.current_run().resume()
        with guard.step() as step:
            step.model_call(model="gpt-4.1", input_tokens=10, output_tokens=2)
            lookup("杭州天气-CANARY")

    f()
    spans = sink.spans
    assert len(spans) >= 4

    class Keep(SpanExporter):
        def export(self, batch):  # type: ignore[no-untyped-def]
            self.batch = batch
            return SpanExportResult.SUCCESS

    inner = Keep()
    red = RedactingSpanExporter(inner)
    assert red.export(spans) is SpanExportResult.SUCCESS
    assert inner.batch is spans  # nothing to drop: the very same batch, no copy
    assert (red.redacted_spans, red.redacted_attributes, red.redacted_events) == (0, 0, 0)
