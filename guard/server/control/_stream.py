"""``GuardControl.Attach``: the bidirectional stream to one agent process.

The servicer only adapts: a reader task turns AgentMessages into registry calls, the handler
coroutine writes whatever the registry queued for this session. Errors are per message:
after the Hello, a message out of bounds (an empty or oversized run id, a counter or a cost
past its bound, a second Hello, a kind this guard does not know, a batch over its limits,
a message over :data:`MAX_CONTROL_MESSAGE_BYTES`) is answered with a ``Reject`` naming it
and changes nothing, and the stream goes on; a termination record out of bounds is also
dead-lettered (``_record_in``). Only what makes the stream itself unusable ends it, with a
clear status: a failed authentication or another tenant's run or stream, a first message
that is not a valid Hello, bytes that do not parse. A dropped stream detaches the
session's runs (``agent_grace_s`` before ``agent_lost``). The Hello's clock tells the
agent's skew (``_clocks``).

Every message is validated whole against :mod:`guard.bounds` before any of it is applied
(``guard.wire.check_*``), and a Hello re-registering many live runs is applied in slices of
:data:`HELLO_SLICE` runs that yield to the event loop between them, so one agent's reconnect
cannot hold the loop (and every other tenant's decisions) for long.

Batches (``AgentBatch`` / ``GuardBatch``) cut the grpc.aio cost per run, which is per stream
message: every message is read from an agent's batch and applied in order, exactly as if it
had come alone (a batch that holds a Hello or another batch, or more than
``MAX_BATCH_MESSAGES``, is refused whole before any of it applies); whatever the registry
queued for the session by the time the writer runs goes out as one GuardBatch (bounded:
``guard.wire.take_encoded``: serialized once, the batch framed as bytes), to an agent
whose Hello set ``accepts_batches`` (any other gets one GuardMessage per write, as before).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

import grpc

from guard import wire
from guard.errors import GuardError, InputTooLarge, InvalidInput
from guard.server._host import GuardHost
from guard.server.control._clocks import note_hello_clock
from guard.server.control._fanout import AgentSession
from guard.server.runs._record_in import end_record, mend_started, refuse_message
from guard.server.runtime import _memtrim
from guard.server.runtime._status import abort_for
from guard.v1 import guard_pb2 as pb
from guard.v1 import guard_pb2_grpc

__all__ = [
    "HELLO_CHECK_SLICE",
    "HELLO_SLICE",
    "MAX_CONTROL_MESSAGE_BYTES",
    "ControlServicer",
    "Oversize",
    "add_to_server",
    "apply_message",
    "refuse",
]

HELLO_SLICE = 32  # Hello.live_runs registered between two yields to the event loop
HELLO_CHECK_SLICE = 256  # Hello.live_runs validated between two yields
# The largest AgentMessage read: the largest batch the SDK makes (its messages' bytes, their
# framing, the batch's own), so no message a well-behaved agent sends is refused for its
# size; OTLP Export keeps the server's larger limit (``GuardServer.max_message_bytes``).
MAX_CONTROL_MESSAGE_BYTES = wire.MAX_BATCH_BYTES + 6 * wire.MAX_BATCH_MESSAGES + 16


def apply_message(
    registry: Any, session: AgentSession, msg: pb.AgentMessage, body: str | None, principal: Any
) -> None:
    """One AgentMessage after the Hello (alone, or one of a batch): checked, applied (the
    caller then settles with shared budgets: ``budgets.sync``, when they settle). The control
    reader's step, and the fuzz harness's in-process target's. Raises ``InvalidInput`` (the
    reader answers it with a ``Reject``: :func:`refuse`) having changed nothing."""
    if body == "run_started":
        rs = msg.run_started
        if mend_started(rs, time.time(), getattr(session, "clock_skew_s", None)):
            registry.stats["runs_clock_mended"] = registry.stats.get("runs_clock_mended", 0) + 1
        wire.check_run_started(rs)
        registry.register(session, rs, principal)
    elif body == "run_ended":
        # refused on its own (Reject), never ending the stream: see _record_in
        end_record(registry, session, msg.run_ended.outcome, principal)
    elif body == "heartbeat":
        wire.check_heartbeat(msg.heartbeat)
        registry.heartbeat(session, msg.heartbeat)
    elif body == "ack":
        registry.ack(session, msg.ack)
    elif body == "allowance_request":
        wire.check_allowance_request(msg.allowance_request)
        registry.budgets.request(session, msg.allowance_request, principal)
    elif body == "hello":
        raise InvalidInput("hello sent twice on one stream")
    else:  # empty, or a kind this guard does not know (a newer agent's)
        raise InvalidInput("empty or unknown AgentMessage")


def refuse(registry: Any, session: AgentSession, msg: Any, body: str | None, exc: Any) -> None:
    """Answer one AgentMessage that :func:`apply_message` (or the batch check) refused:
    a ``Reject`` naming it, and the stream goes on (``_record_in.refuse_message``)."""
    inner = getattr(msg, body) if body in _NAMED else None
    refuse_message(
        registry,
        session,
        body or "",
        exc,
        run_id=getattr(inner, "run_id", ""),
        request_id=getattr(inner, "request_id", 0),
    )


_NAMED = frozenset({"run_started", "allowance_request", "ack"})  # bodies naming one run


class Oversize:
    """An AgentMessage over :data:`MAX_CONTROL_MESSAGE_BYTES`, never parsed: what the
    Attach deserializer hands the reader instead (its kind read from its first byte)."""

    __slots__ = ("body", "size")

    def __init__(self, data: bytes) -> None:
        self.size = len(data)
        field = _ONEOF_FIELDS.get(data[0] >> 3) if data and data[0] < 0x80 else None
        self.body = field or ""

    def error(self) -> InputTooLarge:
        return InputTooLarge(
            f"control message of {self.size} bytes (max {MAX_CONTROL_MESSAGE_BYTES})"
        )


_ONEOF_FIELDS = {f.number: f.name for f in pb.AgentMessage.DESCRIPTOR.fields}


def _deserialize(data: bytes) -> Any:
    """The Attach stream's request deserializer. The server's receive limit is OTLP's (one
    grpc option for every method); a control message beyond the batch limit is refused here,
    before protobuf builds Python objects of it (8 MB of run id would otherwise become an
    8 MB string and its copies)."""
    if len(data) > MAX_CONTROL_MESSAGE_BYTES:
        return Oversize(data)
    return _parse(data)


_parse = pb.AgentMessage.FromString


class ControlServicer(guard_pb2_grpc.GuardControlServicer):
    def __init__(self, app: GuardHost) -> None:
        self.app = app
        _memtrim.tune_allocator()  # memory of large refused messages goes back (see there)

    async def Attach(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        app = self.app
        registry = app.registry
        try:
            principal = app.auth.principal(context.invocation_metadata())
        except GuardError as exc:
            await abort_for(context, exc)
        session = AgentSession(uuid.uuid4().hex, principal.tenant, registry.log, registry.clock)
        session.clock_skew_s = None  # agent clock minus guard clock, from the Hello
        app.attach_session(session)

        batches = False  # the agent's Hello said it reads GuardMessage.batch

        async def apply(msg: pb.AgentMessage, body: str | None) -> None:
            try:
                apply_message(registry, session, msg, body, principal)
            except InvalidInput as exc:  # one message out of bounds: refused, it alone
                refuse(registry, session, msg, body, exc)
                return
            if registry.budgets.settles:
                await registry.budgets.sync()  # see _parts: settle with shared budgets

        async def read() -> None:
            nonlocal batches
            try:
                first = True
                async for msg in request_iterator:
                    if type(msg) is Oversize:
                        if first:  # no Hello, no stream
                            raise msg.error()
                        refuse_message(registry, session, msg.body, msg.error(), size=msg.size)
                        continue
                    body = msg.WhichOneof("body")
                    if first:
                        if body != "hello":
                            raise InvalidInput(f"first message must be hello, got {body}")
                        first = False
                        batches = msg.hello.accepts_batches
                        await self._hello(session, msg.hello, principal)
                    elif body == "batch":
                        try:
                            # then each message at its turn, as if alone
                            wire.check_batch(msg.batch)
                        except InvalidInput as exc:  # none of it applies; the stream goes on
                            refuse(registry, session, msg, body, exc)
                            continue
                        for inner in msg.batch.messages:
                            await apply(inner, inner.WhichOneof("body"))
                    else:
                        await apply(msg, body)
            except GuardError as exc:
                session.error = exc
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                session.error = InvalidInput(f"bad message: {type(exc).__name__}: {exc}")
            session.close()

        reader = asyncio.ensure_future(read())
        try:
            queue, carry = session.queue, None
            while True:
                item = carry if carry is not None else await queue.get()
                # whatever else is ready goes in the same write (one GuardBatch for an agent
                # that reads them: one grpc message instead of one per command), as bytes
                if batches:
                    payload, carry, closing = wire.take_encoded(queue, item, AgentSession.is_close)
                else:
                    closing = AgentSession.is_close(item)
                    payload, carry = None if closing else item, None
                if payload is not None:
                    await context.write(payload)
                if closing:
                    break
            if session.error is not None:
                await abort_for(context, session.error)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            registry.detach(session)
            app.detach_session(session)

    async def _hello(self, session: AgentSession, hello: pb.Hello, principal: Any) -> None:
        """The first message: checked whole, then welcomed, then its live runs registered in
        slices (a large one takes its tenant's turn, see ``_fair``). The Hello's own fields
        out of bounds, or a live run of another tenant, end the stream before anything
        applies; one live run out of bounds is refused on its own (a ``Reject`` for its
        RunStarted, after the Welcome), as it would be when sent alone: a run the agent
        registered while disconnected must not keep its whole process from the guard."""
        registry = self.app.registry
        wire.check_hello(hello, live_runs=False)
        # authorise before welcoming: a refused stream gets no policy
        tenant = hello.tenant or (principal.tenant or "")
        principal.check_tenant(tenant, "the stream")
        note_hello_clock(registry, session, hello)
        skew, now = session.clock_skew_s, time.time()
        refused: dict[int, InvalidInput] = {}
        big = len(hello.live_runs) > HELLO_SLICE
        async with self.app.turns.turn(principal.tenant) if big else contextlib.nullcontext():
            # every live run is checked before any is applied (start times put on the
            # guard's clock first: a skewed agent clock is no reason to refuse)
            for i, rs in enumerate(hello.live_runs, 1):
                mend_started(rs, now, skew)
                try:
                    wire.check_run_started(rs)
                except InvalidInput as exc:
                    refused[i] = exc
                principal.check_tenant(rs.tenant or tenant)
                if i % HELLO_CHECK_SLICE == 0:
                    await asyncio.sleep(0)
            session.send("welcome", self._welcome(session))
            registry.hello(session, hello, principal, restore=False)
            for i, rs in enumerate(hello.live_runs, 1):
                refusal = refused.get(i)
                if refusal is None:
                    try:
                        registry.register(session, rs, principal, restoring=True)
                    except InvalidInput as err:
                        refusal = err
                if refusal is not None:
                    refuse_message(
                        registry,
                        session,
                        "run_started",
                        refusal,
                        run_id=rs.run_id,
                        request_id=rs.request_id,
                    )
                if i % HELLO_SLICE == 0:
                    await asyncio.sleep(0)

    def _welcome(self, session: AgentSession) -> pb.Welcome:
        cfg = self.app.config
        return wire.welcome_to_pb(
            self.app.guard_id,
            session.session_id,
            int(cfg.guard.heartbeat_interval_ms),
            round(cfg.guard.agent_grace_s),
            self.app.policy_pb,
        )

    @staticmethod
    def policy(config: Any) -> pb.Policy:
        return wire.policy_to_pb(config)


def _serialize(msg: Any) -> bytes:
    """The Attach stream's response serializer: a GuardMessage, or bytes already serialized
    (a batch, see ``take_encoded``), which go out as they are."""
    return msg if type(msg) is bytes else msg.SerializeToString()


def add_to_server(servicer: ControlServicer, server: Any) -> None:
    """``guard_pb2_grpc.add_GuardControlServicer_to_server`` with :func:`_serialize` as the
    response serializer (the writer hands grpc a batch as bytes)."""
    handlers = {
        "Attach": grpc.stream_stream_rpc_method_handler(
            servicer.Attach,
            request_deserializer=_deserialize,
            response_serializer=_serialize,
        )
    }
    name = "guard.v1.GuardControl"
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)
