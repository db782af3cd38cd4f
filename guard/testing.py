"""Helpers to test agents under otel-guard: an in-memory span sink and a scripted agent loop.

::

    from guard.testing import FakeModel, Reply, ToolCall, capture_spans, run_agent_loop

    def test_my_agent_stops_looping():
        model = FakeModel.looping(ToolCall("search", {"q": "refund"}), input_growth=500)
        with capture_spans() as spans:
            with pytest.raises(guard.RunStopped) as stop:
                my_agent(model)           # your @guard.run function
        assert stop.value.outcome.reason == "loop_detected"
        assert spans.names().count("guard.step") == stop.value.outcome.steps
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import guard

__all__ = [
    "FakeModel",
    "Reply",
    "SpanSink",
    "ToolCall",
    "capture_spans",
    "run_agent_loop",
    "run_agent_loop_sync",
]


class SpanSink:
    """Every span the SDK emits, kept in memory (an SDK TracerProvider + InMemorySpanExporter)."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    @property
    def spans(self) -> tuple[ReadableSpan, ...]:
        return tuple(self.exporter.get_finished_spans())

    def names(self) -> list[str]:
        return [s.name for s in self.spans]

    def named(self, name: str) -> list[ReadableSpan]:
        """Spans with exactly this name, or starting with it followed by a space."""
        return [s for s in self.spans if s.name == name or s.name.startswith(name + " ")]

    def attributes(self, name: str) -> list[dict[str, Any]]:
        return [dict(s.attributes or {}) for s in self.named(name)]

    def dump(self) -> str:
        """Everything a span carries (names, attributes, events, status) as one string:
        handy for asserting that no raw text leaks."""
        parts = []
        for s in self.spans:
            parts.append(s.to_json())
        return "\n".join(parts)

    def clear(self) -> None:
        self.exporter.clear()


@contextlib.contextmanager
def capture_spans(**settings: Any) -> Iterator[SpanSink]:
    """Configure the SDK (local-only unless ``endpoint=`` is given) to emit into a sink.

    Restores an unconfigured SDK afterwards (the next run reads the environment again).
    """
    from guard.sdk._api import reset

    sink = SpanSink()
    guard.configure(tracer_provider=sink.provider, **settings)
    try:
        yield sink
    finally:
        reset()
        sink.provider.shutdown()


@dataclass(frozen=True)
class ToolCall:
    name: str
    args: Mapping[str, Any] = field(default_factory=dict)
    id: str = ""


@dataclass(frozen=True)
class Reply:
    """One scripted model turn: tool calls to make, or (none) the final ``text``."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    input_tokens: int = 100
    output_tokens: int = 20
    model: str = "gpt-4.1"


class FakeModel:
    """A scripted model. ``replies`` are returned in order; then ``then`` (default: the last
    reply forever, which is exactly a runaway agent)."""

    def __init__(
        self, replies: Sequence[Reply], *, then: Reply | None = None, input_growth: int = 0
    ) -> None:
        if not replies:
            raise ValueError("FakeModel needs at least one reply")
        self.replies = list(replies)
        self.then = then if then is not None else self.replies[-1]
        self.input_growth = input_growth  # history resent every round: B + (n-1)·D
        self.calls = 0
        self._ids = itertools.count(1)

    @classmethod
    def looping(cls, call: ToolCall, **kw: Any) -> FakeModel:
        """A model that asks for the same tool call forever."""
        return cls([Reply(tool_calls=(call,))], **kw)

    @classmethod
    def answering(cls, text: str = "done", after: Sequence[ToolCall] = ()) -> FakeModel:
        """A healthy model: the given tool calls, one per turn, then a final answer."""
        turns = [Reply(tool_calls=(c,)) for c in after]
        return cls([*turns, Reply(text=text)])

    def complete(self, messages: Sequence[Any] = ()) -> Reply:
        reply = self.replies[self.calls] if self.calls < len(self.replies) else self.then
        growth = self.input_growth * self.calls
        self.calls += 1
        calls = tuple(
            ToolCall(c.name, c.args, c.id or f"call_{next(self._ids)}") for c in reply.tool_calls
        )
        return Reply(
            reply.text, calls, reply.input_tokens + growth, reply.output_tokens, reply.model
        )

    async def acomplete(self, messages: Sequence[Any] = ()) -> Reply:
        await asyncio.sleep(0)
        return self.complete(messages)


ToolFn = Callable[..., Any]


def _answered(step: Any, reply: Any) -> bool:
    """Record the model call of ``reply``; True when it is the final answer (no tool calls)."""
    step.model_call(
        model=reply.model, input_tokens=reply.input_tokens, output_tokens=reply.output_tokens
    )
    return not reply.tool_calls


async def run_agent_loop(model: FakeModel, tools: Mapping[str, ToolFn], *, prompt: str = "") -> str:
    """A plain async tool loop instrumented with the SDK (call it inside ``@guard.run``).

    Each round is one ``guard.step()``: a model call, then its tool calls run in parallel via
    :func:`guard.run_tools` (overflow calls are answered with error results). Returns the final
    text. Tools may be sync or async and receive the call's arguments as keywords.
    """
    messages: list[Any] = [{"role": "user", "content": prompt}]
    while True:
        async with guard.step() as step:
            reply = await model.acomplete(messages)
            if _answered(step, reply):
                return reply.text

            async def call(tc: ToolCall) -> Any:
                result = tools[tc.name](**tc.args)
                if inspect.isawaitable(result):
                    result = await result
                step.tool_call(tc.name, dict(tc.args), result=result, call_id=tc.id)
                return result

            results = await guard.run_tools(list(reply.tool_calls), call)
            messages.append({"role": "tool", "results": results})


def run_agent_loop_sync(model: FakeModel, tools: Mapping[str, ToolFn], *, prompt: str = "") -> str:
    """The synchronous twin of :func:`run_agent_loop` (tools run one after another)."""
    messages: list[Any] = [{"role": "user", "content": prompt}]
    while True:
        with guard.step() as step:
            reply = model.complete(messages)
            if _answered(step, reply):
                return reply.text
            for tc in reply.tool_calls:
                result = tools[tc.name](**tc.args)
                step.tool_call(tc.name, dict(tc.args), result=result, call_id=tc.id)
                messages.append({"role": "tool", "content": result})
