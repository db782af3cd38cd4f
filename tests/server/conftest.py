"""Helpers for the server tests: OTLP span builders and a minimal control-stream agent."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import grpc
import pytest
from _wait import wait_until_async
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as otlp_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from guard.policy import PolicyConfig
from guard.server import GuardServer, MemorySink
from guard.v1 import guard_pb2 as pb
from guard.v1 import guard_pb2_grpc

_counter = iter(range(1, 1 << 30))


def attr(key: str, value: Any) -> common_pb2.KeyValue:
    v = common_pb2.AnyValue()
    if isinstance(value, bool):
        v.bool_value = value
    elif isinstance(value, int):
        v.int_value = value
    elif isinstance(value, float):
        v.double_value = value
    else:
        v.string_value = str(value)
    return common_pb2.KeyValue(key=key, value=v)


def span(
    name: str,
    trace_id: bytes,
    attrs: dict[str, Any],
    *,
    span_id: bytes | None = None,
    parent: bytes = b"",
) -> trace_pb2.Span:
    return trace_pb2.Span(
        name=name,
        trace_id=trace_id,
        span_id=span_id or next(_counter).to_bytes(8, "big"),
        parent_span_id=parent,
        attributes=[attr(k, v) for k, v in attrs.items()],
    )


def request(*spans: trace_pb2.Span) -> otlp.ExportTraceServiceRequest:
    return otlp.ExportTraceServiceRequest(
        resource_spans=[{"scope_spans": [{"spans": list(spans)}]}]
    )


def model_span(run_id: str, trace_id: bytes, *, tokens_in=100, tokens_out=10, **extra) -> Any:
    attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "gpt-4.1",
        "gen_ai.usage.input_tokens": tokens_in,
        "gen_ai.usage.output_tokens": tokens_out,
        "guard.run.id": run_id,
        **extra,
    }
    return span("chat gpt-4.1", trace_id, attrs)


def tool_span(run_id: str, trace_id: bytes, fp: str, result: str = "00") -> Any:
    attrs = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "search",
        "guard.action.fingerprint": fp,
        "guard.result.hash": result,
        "guard.run.id": run_id,
    }
    return span("execute_tool search", trace_id, attrs)


def step_span(run_id: str, trace_id: bytes, index: int, **extra) -> Any:
    attrs = {"guard.run.id": run_id, "guard.step.index": index, **extra}
    return span("guard.step", trace_id, attrs)


def trace_id_of(n: int) -> bytes:
    return n.to_bytes(16, "big")


# -- wire-level builders: requests with attributes given as their encoded bytes -------------
def varint(n: int) -> bytes:
    """The protobuf varint of ``n`` (negative numbers as their 64-bit two's complement)."""
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number: int, wire: int, payload: bytes | int) -> bytes:
    """One protobuf field: wire 0 takes an int, 2 bytes, 1 and 5 the fixed-size bytes."""
    tag = varint(number << 3 | wire)
    if wire == 0:
        return tag + varint(payload)  # type: ignore[arg-type]
    if wire in (1, 5):
        return tag + payload  # type: ignore[operator]
    return tag + varint(len(payload)) + payload  # type: ignore[arg-type]


def raw_span(name: str, trace_id: bytes, attributes: list[bytes], **more: bytes) -> bytes:
    """A serialized Span: name, trace id and the given encoded KeyValues, then ``more``
    (already encoded fields, in order)."""
    out = field(1, 2, trace_id) + field(5, 2, name.encode())
    out += b"".join(field(9, 2, a) for a in attributes)
    return out + b"".join(more.values())


def raw_request(*spans: bytes) -> bytes:
    """A serialized ExportTraceServiceRequest holding ``spans`` in one ScopeSpans."""
    scope_spans = b"".join(field(2, 2, s) for s in spans)
    return field(1, 2, field(2, 2, scope_spans))


class Agent:
    """A hand-rolled GuardControl client: hello, run_started, auto-ack, message log."""

    def __init__(self, address: str, token: str | None = None, tenant: str = "acme") -> None:
        self.channel = grpc.aio.insecure_channel(address)
        self.stub = guard_pb2_grpc.GuardControlStub(self.channel)
        self.otlp = otlp_grpc.TraceServiceStub(self.channel)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.tenant = tenant
        self.outbox: asyncio.Queue[Any] = asyncio.Queue()
        self.messages: list[pb.GuardMessage] = []
        self.new = asyncio.Event()
        self.call: Any = None
        self.task: asyncio.Task[Any] | None = None
        self.error: grpc.RpcError | None = None
        self._req = 0

    async def _requests(self):
        while True:
            msg = await self.outbox.get()
            if msg is None:
                return
            yield msg

    async def connect(
        self, live_runs: list[pb.RunStarted] = (), process_id="p1", ended_runs=()
    ) -> pb.Welcome:
        self.call = self.stub.Attach(self._requests(), metadata=self.metadata)
        hello = pb.Hello(
            process_id=process_id,
            tenant=self.tenant,
            live_runs=list(live_runs),
            ended_runs=list(ended_runs),
        )
        await self.outbox.put(pb.AgentMessage(hello=hello))
        self.task = asyncio.ensure_future(self._read())
        msg = await self.wait_for(lambda m: m.WhichOneof("body") == "welcome")
        return msg.welcome

    async def _read(self) -> None:
        try:
            async for msg in self.call:
                self.messages.append(msg)
                if msg.WhichOneof("body") in ("admit", "deny", "warn", "wrap_up", "cancel"):
                    body = getattr(msg, msg.WhichOneof("body"))
                    ack = pb.Ack(command_id=msg.command_id, run_id=body.run_id, applied=True)
                    await self.outbox.put(pb.AgentMessage(ack=ack))
                self.new.set()
        except grpc.RpcError as exc:
            self.error = exc
            self.new.set()

    async def wait_for(self, pred, timeout: float = 5.0) -> pb.GuardMessage:
        """The first message received that matches ``pred``, awaited (bounded); the stream's
        error, if it ended with one and no message matched."""

        seen = 0  # messages already checked: each is checked once (some tests get thousands)

        def match() -> pb.GuardMessage | None:
            nonlocal seen
            new, seen = self.messages[seen:], len(self.messages)
            found = next((m for m in new if pred(m)), None)
            if found is None and self.error is not None:
                raise self.error
            return found

        return await wait_until_async(
            match, timeout, lambda: f"a matching message; got {self.messages}", wake=self.new
        )

    async def start_run(self, run_id: str, trace_id: bytes, **kw) -> pb.GuardMessage:
        self._req += 1
        rs = pb.RunStarted(
            run_id=run_id,
            trace_id=trace_id.hex(),
            tenant=kw.pop("tenant", self.tenant),
            agent=kw.pop("agent", "bot"),
            request_id=self._req,
            **kw,
        )
        await self.outbox.put(pb.AgentMessage(run_started=rs))
        req = self._req
        return await self.wait_for(
            lambda m: (
                m.WhichOneof("body") in ("admit", "deny")
                and getattr(m, m.WhichOneof("body")).request_id == req
            )
        )

    async def end_run(self, run_id: str, status="completed", reason="final_answer", **kw):
        outcome = pb.Outcome(run_id=run_id, status=status, reason=reason, tenant=self.tenant, **kw)
        await self.outbox.put(pb.AgentMessage(run_ended=pb.RunEnded(outcome=outcome)))

    async def export(self, *spans: Any) -> otlp.ExportTraceServiceResponse:
        return await self.otlp.Export(request(*spans), metadata=self.metadata)

    def directives(self, kind: str, run_id: str | None = None) -> list[pb.Directive]:
        out = []
        for m in self.messages:
            if m.WhichOneof("body") == kind:
                d = getattr(m, kind)
                if run_id is None or d.run_id == run_id:
                    out.append(d)
        return out

    async def close(self) -> None:
        await self.outbox.put(None)
        if self.task is not None:
            self.task.cancel()
        await self.channel.close()


@pytest.fixture
def sink() -> MemorySink:
    return MemorySink()


def config(**data: Any) -> PolicyConfig:
    return PolicyConfig.from_dict(data or None)


@pytest.fixture
async def guard(sink):
    async with GuardServer(config(), listen="127.0.0.1:0", sink=sink) as srv:
        yield srv


AUTH_ENV = {"ADMIN_T": "admin-secret", "ACME_T": "acme-secret", "GLOBEX_T": "globex-secret"}
AUTH = {
    "admin_token_env": "ADMIN_T",
    "tenants": {"acme": {"token_env": "ACME_T"}, "globex": {"token_env": "GLOBEX_T"}},
}


def env_with(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


async def two_tenants(address: str) -> tuple[Agent, Agent]:
    """Agents of acme (run a1, trace 2) and globex (run g1, trace 3) on ``address``."""
    acme = Agent(address, token="acme-secret", tenant="acme")
    await acme.connect()
    await acme.start_run("a1", trace_id_of(2))
    globex = Agent(address, token="globex-secret", tenant="globex")
    await globex.connect(process_id="g")
    await globex.start_run("g1", trace_id_of(3))
    return acme, globex
